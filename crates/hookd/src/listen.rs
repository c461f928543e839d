//! `hookd listen`: a local receiver for development. It prints every webhook
//! it gets (headers and pretty JSON), says whether the Standard Webhooks
//! signature verifies, and can rehearse failures (`--status`, `--fail-rate`,
//! `--delay`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use clap::Args;
use hookd_domain::signing::SigningSecret;

/// `hookd listen`.
#[derive(Debug, Args)]
pub struct ListenArgs {
    /// Port to listen on.
    #[arg(long, default_value_t = 9000)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// The subscription's secret (`whsec_…`), to verify signatures.
    #[arg(long, env = "HOOKD_LISTEN_SECRET")]
    secret: Option<String>,
    /// Answer every request with this status.
    #[arg(long, default_value_t = 200)]
    status: u16,
    /// Answer this fraction of requests (0.0 to 1.0) with 500 instead.
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Wait this long before answering (e.g. `2s`, `150ms`).
    #[arg(long, value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
}

#[derive(Debug)]
struct Behaviour {
    secret: Option<SigningSecret>,
    status: StatusCode,
    fail_rate: f64,
    delay: Option<Duration>,
}

/// Runs the receiver until Ctrl-C.
pub async fn run(args: ListenArgs) -> anyhow::Result<()> {
    let secret = args
        .secret
        .as_deref()
        .map(SigningSecret::parse)
        .transpose()
        .context("--secret must be the subscription's `whsec_…` secret")?;
    let status =
        StatusCode::from_u16(args.status).context("--status must be an HTTP status code")?;
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.fail_rate),
        "--fail-rate must be between 0 and 1"
    );
    let behaviour = Arc::new(Behaviour {
        secret,
        status,
        fail_rate: args.fail_rate,
        delay: args.delay,
    });
    let addr = SocketAddr::new(args.bind, args.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    println!("hookd listen: waiting for webhooks on http://{addr}/ (Ctrl-C to stop)");
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let b = behaviour.clone();
        async move { receive(&b, uri, headers, body).await }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving")?;
    Ok(())
}

async fn receive(b: &Behaviour, uri: Uri, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut out = String::new();
    out.push_str(&format!(
        "\n── webhook at {} {}\n",
        chrono::Utc::now().format("%H:%M:%S%.3f"),
        uri.path()
    ));
    for (name, value) in &headers {
        out.push_str(&format!(
            "{name}: {}\n",
            value.to_str().unwrap_or("<binary>")
        ));
    }
    out.push_str(&match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(&body).into_owned(),
    });
    out.push('\n');
    out.push_str(&verdict(b.secret.as_ref(), &headers, &body));
    let status = if b.fail_rate > 0.0 && rand::random::<f64>() < b.fail_rate {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        b.status
    };
    if let Some(d) = b.delay {
        tokio::time::sleep(d).await;
    }
    out.push_str(&format!("→ answering {status}\n"));
    print!("{out}");
    status
}

/// Whether the request's signature verifies, in words.
fn verdict(secret: Option<&SigningSecret>, headers: &HeaderMap, body: &[u8]) -> String {
    let Some(secret) = secret else {
        return "signature: not checked (start with --secret whsec_… to check it)\n".into();
    };
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    let (Some(id), Some(ts), Some(sig)) = (
        get("webhook-id"),
        get("webhook-timestamp"),
        get("webhook-signature"),
    ) else {
        return "signature: MISSING webhook-id / webhook-timestamp / webhook-signature headers\n"
            .into();
    };
    let Ok(ts) = ts.parse::<i64>() else {
        return "signature: INVALID webhook-timestamp\n".into();
    };
    let skew = (chrono::Utc::now().timestamp() - ts).abs();
    if secret.verify(id, ts, body, sig) {
        format!("signature: valid ✓ (timestamp {skew} s from this clock)\n")
    } else {
        "signature: INVALID ✗ (wrong secret, or the body was changed)\n".into()
    }
}
