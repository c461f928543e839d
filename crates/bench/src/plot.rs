//! SVG plots (plotters' SVG backend only: text is left to the viewer, so no
//! font or system library is needed).

use std::path::Path;

use anyhow::{Context as _, anyhow};
use plotters::prelude::*;

const COLOURS: [RGBColor; 4] = [BLUE, RED, GREEN, MAGENTA];

/// The latency percentile curve of each named run: x in "nines" (0 = p0,
/// 1 = p90, 2 = p99, 3 = p99.9), y in milliseconds.
pub fn latency_curves(
    path: &Path,
    title: &str,
    runs: &[(&str, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let nines = |pct: f64| -(1.0 - pct / 100.0).max(1e-6).log10();
    let x_max = runs
        .iter()
        .flat_map(|(_, c)| c.iter().map(|&(p, _)| nines(p)))
        .fold(1.0, f64::max);
    // Log scale: a tail seconds long and a median of milliseconds both show.
    let y_max = runs
        .iter()
        .flat_map(|(_, c)| c.iter().map(|&(_, ms)| ms))
        .fold(1.0, f64::max)
        * 1.5;
    let y_min = runs
        .iter()
        .flat_map(|(_, c)| c.iter().map(|&(_, ms)| ms))
        .fold(y_max, f64::min)
        .max(0.01)
        / 1.5;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, (y_min..y_max).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("event → delivery latency (ms, log scale)")
        .x_labels(5)
        .x_label_formatter(&|x| format!("p{}", trim(100.0 * (1.0 - 10f64.powf(-x)))))
        .draw()
        .map_err(plot_err)?;
    for (i, (name, curve)) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                curve.iter().map(|&(p, ms)| (nines(p), ms.max(y_min))),
                colour.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Per-second counts, one line per named series, x in seconds from the first POST.
pub fn per_second(
    path: &Path,
    title: &str,
    y_desc: &str,
    series: &[(&str, &[u64])],
) -> anyhow::Result<()> {
    let x_max = series
        .iter()
        .map(|(_, s)| s.len())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let y_max = series
        .iter()
        .flat_map(|(_, s)| s.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.1;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first POST")
        .y_desc(y_desc)
        .draw()
        .map_err(plot_err)?;
    for (i, (name, s)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                s.iter().enumerate().map(|(sec, &n)| (sec as f64, n as f64)),
                colour.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Writes `path`'s parent directory, then the plot, with context.
pub fn write(path: &Path, draw: impl FnOnce(&Path) -> anyhow::Result<()>) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    draw(path).with_context(|| format!("plotting {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn trim(pct: f64) -> String {
    let s = format!("{pct:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("{e}")
}
