//! The `tollgate` binary: `serve` runs the server; `limits` manages a running server's limits
//! through its admin API; `acquire` runs a command under a permit.
//!
//! `main` parses the command line (`cli`), reads the configuration (`config`) and hands the
//! command to its body (`commands`). Beside them: the admin token a command sends
//! (`admin_token`), the HTTP client glue (`http`), running `acquire`'s command (`supervise`),
//! and the tables of records (`tables`, `status`).

mod admin_token;
mod cli;
mod commands;
mod config;
mod http;
mod limits_file;
mod status;
mod supervise;
mod tables;

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};

use crate::cli::{Cli, Command, LimitsAction, Output, ServerArgs};
use crate::config::read_file_config;

/// Exit code of a client command whose server failed or could not be reached (EX_UNAVAILABLE).
const EXIT_SERVER_FAILED: u8 = 69;

fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let server_from_flag = matches
        .subcommand()
        .and_then(|(_, sub)| sub.value_source("server"))
        .or_else(|| matches.value_source("server"))
        == Some(clap::parser::ValueSource::CommandLine);
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate: cannot start the async runtime: {error}");
            return ExitCode::from(EXIT_SERVER_FAILED);
        }
    };
    match runtime.block_on(run(cli, server_from_flag)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("tollgate: {}", said_once(&error));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, each said once: a cause whose text an outer message already
/// carries (`"rules database: {0}"` over its source) is not repeated.
fn said_once(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

async fn run(cli: Cli, server_from_flag: bool) -> Result<ExitCode> {
    let file = read_file_config(cli.config.as_deref())?;
    let server = ServerArgs { server: cli.server };
    let output = cli.output.unwrap_or_else(|| {
        // Records for people on a terminal; for programs everywhere else.
        if std::io::stdout().is_terminal() {
            Output::Table
        } else {
            Output::Json
        }
    });
    match cli.command {
        Command::Serve(_) if server_from_flag => Err(anyhow!(
            "--server names the server the client commands talk to; serve listens on --listen"
        )),
        Command::Serve(args) => commands::serve(*args, file).await,
        // Checking a file asks no server, so needs neither its address nor a token.
        Command::Limits {
            action: LimitsAction::Check { file: path },
            ..
        } => commands::check_limits(&path).await,
        Command::Limits { action } => commands::limits(server, output, action, file).await,
        Command::Acquire(args) => commands::acquire(args, server, file).await,
        Command::Tokens { action } => commands::tokens(server, output, action, file).await,
        Command::Status { limit, key } => commands::status(server, limit, key, output, file).await,
        Command::Simulate {
            workload,
            json,
            chart,
        } => {
            let json = json || cli.output == Some(Output::Json);
            tokio::task::spawn_blocking(move || {
                commands::simulate(&workload, json, chart.as_deref())
            })
            .await
            .context("the simulation stopped")?
        }
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "tollgate", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_says_each_cause_once() {
        let repeated = anyhow::Error::new(std::io::Error::other("pool timed out"))
            .context("rules database: pool timed out");
        assert_eq!(said_once(&repeated), "rules database: pool timed out");
        let distinct =
            anyhow::Error::new(std::io::Error::other("connection refused")).context("store");
        assert_eq!(said_once(&distinct), "store: connection refused");
    }
}
