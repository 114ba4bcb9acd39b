//! `simulate`: a workload run on a paused clock, its report, its chart, and exit 70 if a limit
//! was overdrawn.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};

/// Exit code of `simulate` when a limit was overdrawn (EX_SOFTWARE): a defect, never a workload's
/// fault.
const EXIT_OVERDRAWN: u8 = 70;

/// `simulate`, on a runtime of its own whose clock is paused: time moves only when every task
/// waits, straight to the next timer, so simulated hours take seconds.
pub(crate) fn simulate(path: &Path, json: bool, chart: Option<&Path>) -> Result<ExitCode> {
    use std::io::Write;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the workload {}", path.display()))?;
    let workload = tollgate_cli::simulate::parse(&text)
        .with_context(|| format!("workload {}", path.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let report = runtime.block_on(tollgate_cli::simulate::run(&workload, move |done| {
        if terminal {
            let filled = (done * 40.0) as usize;
            eprint!(
                "\rsimulating [{}{}] {:>3.0} %",
                "#".repeat(filled),
                " ".repeat(40 - filled),
                done * 100.0
            );
            let _ = std::io::stderr().flush();
        }
    }))?;
    if terminal {
        eprintln!();
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", tollgate_cli::simulate::table(&report));
    }
    if let Some(chart) = chart {
        std::fs::write(chart, tollgate_cli::simulate::chart(&report))
            .with_context(|| format!("writing the chart {}", chart.display()))?;
    }
    let overdrawn = report.overshoots();
    if !overdrawn.is_empty() {
        for limit in overdrawn {
            eprintln!(
                "tollgate: limit {} was overdrawn: {} units in one window, limit {}",
                limit.name, limit.max_in_window, limit.limit
            );
        }
        return Ok(ExitCode::from(EXIT_OVERDRAWN));
    }
    Ok(ExitCode::SUCCESS)
}
