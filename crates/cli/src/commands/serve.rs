//! `serve`: the configuration resolved, logging, the admin token kept when none is configured
//! (and where it is recorded withdrawn at a clean stop), the stop signals and SIGHUP's reload,
//! and the server run until a stop signal arrives.

use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use tollgate_cli::kept_token;

use crate::admin_token::admin_token_path;
use crate::cli::ServeArgs;
use crate::config::{FileConfig, resolve_server_config};

fn init_logging(filter: &str, format: &str) -> Result<()> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let targets: tracing_subscriber::filter::Targets = filter
        .parse()
        .map_err(|error| anyhow!("log filter {filter:?}: {error}"))?;
    let registry = tracing_subscriber::registry().with(targets);
    match format {
        "text" => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
        "json" => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
        other => bail!("log_format must be text or json, got {other:?}"),
    }
    Ok(())
}

/// Asks the server to reload its rules on each SIGHUP, as daemons do. Installed when this is
/// called, before the server starts, so a SIGHUP never meets the default action (death).
fn reload_signal() -> Result<tokio::sync::mpsc::UnboundedReceiver<&'static str>> {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                tracing::info!(signal = "SIGHUP", "reloading the rules");
                if sender.send("SIGHUP").is_err() {
                    break;
                }
            }
        });
    }
    #[cfg(not(unix))]
    drop(sender);
    Ok(receiver)
}

/// Waits for SIGINT, SIGTERM or SIGQUIT. The handlers are installed when this is called, not
/// when the future is first polled: a signal sent as soon as the server says it listens must
/// stop it gracefully, not kill it by the default action.
fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        // Every ordinary stop is a clean one: Ctrl-\ (SIGQUIT) saves the counters like
        // SIGTERM, rather than dying and leaving the next start to hold every limit as after a
        // crash. SIGHUP reloads the rules (`reload_signal`).
        let mut stops = Vec::new();
        for (kind, name) in [
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::quit(), "SIGQUIT"),
        ] {
            let stream = signal(kind).with_context(|| format!("installing {name} handler"))?;
            stops.push((stream, name));
        }
        Ok(async move {
            let received = std::future::poll_fn(|context| {
                for (stream, name) in &mut stops {
                    if stream.poll_recv(context).is_ready() {
                        return std::task::Poll::Ready(*name);
                    }
                }
                std::task::Poll::Pending
            })
            .await;
            tracing::info!(signal = received, "stop signal received");
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

pub(crate) async fn serve(args: ServeArgs, file: FileConfig) -> Result<ExitCode> {
    let (mut config, log, log_format) = resolve_server_config(args, file)?;
    init_logging(&log, &log_format)?;
    let mut kept = None;
    if config.admin_token.is_none()
        && let Some(path) = admin_token_path(config.state_url())
    {
        let token = kept_token::read_or_make(&path)?;
        config.admin_token = Some(token.token.clone());
        tracing::info!(
            path = %path.display(),
            "admin token kept in this file (mode 0600); tollgate commands on this machine read it"
        );
        kept = Some((path, token));
    }
    tracing::info!(?config, "starting");
    let scheme = if config.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    // Where this server listened, for withdrawing what it recorded when it stops.
    let listened = std::sync::Arc::new(std::sync::OnceLock::new());
    let on_listening = listened.clone();
    let kept_while_serving = kept.clone();
    let reloads = reload_signal()?;
    tollgate_server::run_with_reloads(config, shutdown_signal()?, reloads, move |address, grpc| {
        let _ = on_listening.set(address);
        // The commands send the kept token to this address alone.
        if let Some((path, token)) = &kept_while_serving {
            if let Err(error) = kept_token::record_listen(path, token, address) {
                tracing::warn!(%error, "could not record where this server listens beside its admin token");
            }
            // And where this user's commands look from any directory.
            match kept_token::record_user_copy(token, address) {
                Ok(copy) => tracing::info!(
                    path = %copy.display(),
                    "admin token kept for this user's commands in any directory (mode 0600)"
                ),
                Err(error) => tracing::warn!(%error, "could not keep a copy of the admin token for this user's commands"),
            }
        }
        // Stable lines on standard output for scripts (and tests) that start on port 0.
        if let Some(grpc) = grpc {
            println!("tollgate: envoy rate limit service (gRPC) on {grpc}");
        }
        println!("tollgate: listening on {scheme}://{address}");
    })
    .await?;
    // A clean stop: nothing tells the commands to look for this server any more. (After a
    // crash the files stay; the commands then find no server to prove it holds the token.)
    if let (Some((path, token)), Some(address)) = (&kept, listened.get()) {
        if let Err(error) = kept_token::withdraw_listen(path, token, *address) {
            tracing::warn!(%error, "could not withdraw where this server listened from beside its admin token");
        }
        match kept_token::remove_user_copy(token, *address) {
            Ok(Some(copy)) => {
                tracing::info!(path = %copy.display(), "this user's copy of the admin token removed")
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, "could not remove this user's copy of the admin token")
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
