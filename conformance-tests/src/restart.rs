//! Restarting a test server started by `scripts/services`, for [`Backend::restart`].
//!
//! [`Backend::restart`]: crate::Backend::restart

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use leasehold_core::{Error, Result};

use crate::backend::configured_url;

/// How to stop and start one service of `scripts/services` (`down SERVICE`, then `up SERVICE`)
/// on the ports it runs on now.
#[derive(Clone, Debug)]
pub(crate) struct ServiceRestart {
    service: &'static str,
    /// `LEASEHOLD_SERVICES_PORT_OFFSET` of the running server: its port minus the service's
    /// port without offset, so `up` brings it back where the clients look for it, whatever
    /// the test process's own environment says.
    offset: i64,
}

impl ServiceRestart {
    /// The restart of `service`, whose port without offset is `base_port`, running at
    /// `upstream` (`host:port`). `None` when `upstream` has no port.
    pub(crate) fn new(service: &'static str, base_port: u16, upstream: &str) -> Option<ServiceRestart> {
        let port: i64 = upstream.rsplit_once(':')?.1.parse().ok()?;
        Some(ServiceRestart {
            service,
            offset: port - i64::from(base_port),
        })
    }

    /// `down`, a pause of `down_for`, `up` (which returns once the server answers).
    pub(crate) async fn run(&self, down_for: Duration) -> Result<()> {
        self.script("down").await?;
        tokio::time::sleep(down_for).await;
        self.script("up").await
    }

    async fn script(&self, command: &'static str) -> Result<()> {
        let script = configured_url("LEASEHOLD_SERVICES_SCRIPT").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/services"),
            PathBuf::from,
        );
        let mut cmd = Command::new(script);
        cmd.args([command, self.service])
            .env("LEASEHOLD_SERVICES_PORT_OFFSET", self.offset.to_string());
        if let Some(dir) = configured_url("LEASEHOLD_SERVICES_DIR") {
            cmd.env("LEASEHOLD_SERVICES_DIR", dir);
        }
        let service = self.service;
        let output = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .map_err(|e| Error::store(service, format!("scripts/services {command}: {e}")))?
            .map_err(|e| Error::store(service, format!("cannot run scripts/services: {e}")))?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or("no output");
        Err(Error::store(
            service,
            format!("scripts/services {command} {service} failed: {last}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_from_the_running_port() {
        let restart = ServiceRestart::new("zookeeper", 22181, "127.0.0.1:27181").unwrap();
        assert_eq!(restart.offset, 5000);
        assert_eq!(
            ServiceRestart::new("redis", 24379, "127.0.0.1:24379").unwrap().offset,
            0
        );
        assert!(ServiceRestart::new("redis", 24379, "localhost").is_none());
    }
}
