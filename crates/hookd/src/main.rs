//! `hookd`: parse the command line, run the command, print any error with
//! its whole chain of causes.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, not glibc's malloc. Every delivery allocates and frees across
/// worker threads (a claimed row, a request, a response, a record); under
/// `fanout` glibc spent about a quarter of hookd's CPU in `_int_malloc`,
/// `unlink_chunk`, `malloc_consolidate` and `free`, and hookd took 46 s of
/// CPU with jemalloc against 72 s without (docs/benchmarks.md, session 8).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = hookd::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
