//! The `authbench` binary: parse the command line, run the benchmark, print the report.
//!
//! Thin on purpose: the logic lives in the `authbench` library, where the tests drive it too.
//! Every failure (bad arguments, unreachable target, refused setup) ends with one
//! `authbench: error: …` line on stderr and a non-zero exit; stdout carries only the
//! report, so `authbench --json … | python3 …` always reads clean JSON.

use authbench::cli::Args;
use clap::{Parser, error::ErrorKind};
use std::{io::IsTerminal, process::ExitCode};

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(&first_line(&e.to_string()), 2),
    };
    let plan = match args.plan(std::io::stderr().is_terminal()) {
        Ok(plan) => plan,
        Err(e) => return fail(&e, 2),
    };
    // One thread by default: on the single core the suite gives the client, a
    // current-thread runtime has no cross-thread wake-ups or work stealing to pay for.
    let runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}"), 1),
    };
    match runtime.block_on(authbench::run(&plan)) {
        Ok(report) if args.json => println!("{}", report.to_json()),
        Ok(report) => print!("{}", report.to_text()),
        Err(e) => return fail(&format!("{e:#}"), 1),
    }
    ExitCode::SUCCESS
}

fn fail(message: &str, code: u8) -> ExitCode {
    eprintln!("authbench: error: {message}");
    ExitCode::from(code)
}

/// clap's message without its `error: ` prefix, usage and tips: one line. A message
/// that ends in a colon continues on the next lines (the missing arguments), which
/// are joined to it.
fn first_line(message: &str) -> String {
    let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid arguments");
    let mut line = first.strip_prefix("error: ").unwrap_or(first).to_string();
    if line.ends_with(':') {
        let listed: Vec<&str> = lines.take_while(|l| !l.starts_with("Usage:")).collect();
        line = format!("{} {}", line, listed.join(", "));
    }
    format!("{line} (see authbench --help)")
}
