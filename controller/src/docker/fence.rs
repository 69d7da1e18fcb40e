//! The network fence of Docker sandboxes: a sandbox reaches the api and
//! nothing else, as the chart's NetworkPolicy has it for Pods.
//!
//! Two parts, because Docker alone has only the first:
//! - **The network** is `internal` (Docker drops what its bridge would
//!   forward anywhere else: the outside, other networks) with
//!   inter-container traffic off (`enable_icc=false`: sandboxes do not
//!   reach each other; their packets are dropped, not refused).
//! - **The host.** Packets from the bridge to one of the host's own
//!   addresses are not forwarded but delivered, so neither option stops a
//!   sandbox from reaching every port the host listens on. The supervisor
//!   (root, on the engine's host) therefore owns an iptables chain,
//!   `MANGO-<bridge>`, jumped to from `INPUT` for packets in on the bridge:
//!   replies to connections the host opened, and TCP to each allowed peer
//!   on the gateway (the api; the egress proxy, when there is one) go on
//!   to the host's own rules; anything else is refused (TCP reset, ICMP
//!   port unreachable), so a tool learns at once that it is fenced.
//!
//! The chain only grows: a supervisor adds its peers and never removes
//! another's, since sandboxes of another pool, or of a supervisor that
//! detached, may rely on them. It is rebuilt with the network.

use std::net::{Ipv4Addr, SocketAddrV4};

/// The bridge option that turns inter-container traffic off.
pub const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";
/// The bridge option that names the bridge's interface.
pub const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";

/// The host firewall of one network's bridge.
pub struct HostFence {
    bridge: String,
    chain: String,
}

impl HostFence {
    /// The fence of the bridge interface `bridge` (15 characters at most,
    /// so the chain's name fits iptables' 28).
    pub fn of(bridge: &str) -> HostFence {
        HostFence {
            bridge: bridge.to_string(),
            chain: format!("MANGO-{bridge}"),
        }
    }

    pub fn chain(&self) -> &str {
        &self.chain
    }

    /// Makes the chain and its jump if missing, and lets `peers` through.
    pub async fn apply(&self, peers: &[SocketAddrV4]) -> Result<(), String> {
        let chain = self.chain.as_str();
        if iptables(&["-n", "-L", chain]).await.is_err() {
            if let Err(err) = iptables(&["-N", chain]).await {
                // Another supervisor may have made it meanwhile.
                if iptables(&["-n", "-L", chain]).await.is_err() {
                    return Err(err);
                }
            }
        }
        ensure(
            chain,
            &[
                "-m",
                "conntrack",
                "--ctstate",
                "ESTABLISHED,RELATED",
                "-j",
                "RETURN",
            ],
            At::First,
        )
        .await?;
        for peer in peers {
            let (ip, port) = (peer.ip().to_string(), peer.port().to_string());
            ensure(
                chain,
                &["-p", "tcp", "-d", &ip, "--dport", &port, "-j", "RETURN"],
                At::First,
            )
            .await?;
        }
        ensure(
            chain,
            &["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
            At::Last,
        )
        .await?;
        ensure(
            chain,
            &["-j", "REJECT", "--reject-with", "icmp-port-unreachable"],
            At::Last,
        )
        .await?;
        ensure("INPUT", &["-i", &self.bridge, "-j", chain], At::First).await
    }

    /// Removes the jump and the chain (a network removed for good).
    pub async fn remove(&self) -> Result<(), String> {
        let chain = self.chain.as_str();
        while iptables(&["-D", "INPUT", "-i", &self.bridge, "-j", chain])
            .await
            .is_ok()
        {}
        if iptables(&["-n", "-L", chain]).await.is_err() {
            return Ok(());
        }
        iptables(&["-F", chain]).await?;
        iptables(&["-X", chain]).await
    }
}

enum At {
    First,
    Last,
}

/// Adds `rule` to `chain` unless it is there.
async fn ensure(chain: &str, rule: &[&str], at: At) -> Result<(), String> {
    let check: Vec<&str> = ["-C", chain]
        .into_iter()
        .chain(rule.iter().copied())
        .collect();
    if iptables(&check).await.is_ok() {
        return Ok(());
    }
    let add: Vec<&str> = match at {
        At::First => ["-I", chain, "1"]
            .into_iter()
            .chain(rule.iter().copied())
            .collect(),
        At::Last => ["-A", chain]
            .into_iter()
            .chain(rule.iter().copied())
            .collect(),
    };
    iptables(&add).await
}

/// `iptables -w …` (waiting for the xtables lock, which Docker also takes).
async fn iptables(args: &[&str]) -> Result<(), String> {
    let out = super::host::command("iptables")
        .arg("-w")
        .args(args)
        .output()
        .await
        .map_err(|e| format!("iptables: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "iptables {} ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// The api as `base_url` names it for sandboxes, which must be the
/// network's gateway (`host.docker.internal` resolves there): nothing
/// else is reachable from a fenced network.
pub fn api_peer(base_url: &str, gateway: Ipv4Addr) -> Result<SocketAddrV4, String> {
    let wrong = |why: &str| {
        format!(
            "MANGO_DOCKER_BASE_URL {base_url:?} {why}: a fenced sandbox reaches only its network's gateway, \
             so name the api as http://host.docker.internal:PORT and have it listen on {gateway}:PORT"
        )
    };
    let (rest, default_port) = if let Some(rest) = base_url.strip_prefix("http://") {
        (rest, 80)
    } else if let Some(rest) = base_url.strip_prefix("https://") {
        (rest, 443)
    } else {
        return Err(wrong("is not an http:// URL"));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .map_err(|_| wrong("has no valid port"))?,
        ),
        None => (authority, default_port),
    };
    if host == "host.docker.internal" || host.parse::<Ipv4Addr>() == Ok(gateway) {
        Ok(SocketAddrV4::new(gateway, port))
    } else {
        Err(wrong("names another host"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_must_be_named_on_the_gateway() {
        let gw = Ipv4Addr::new(172, 18, 0, 1);
        assert_eq!(
            api_peer("http://host.docker.internal:8080", gw),
            Ok(SocketAddrV4::new(gw, 8080))
        );
        assert_eq!(
            api_peer("http://172.18.0.1:9000/v1", gw),
            Ok(SocketAddrV4::new(gw, 9000))
        );
        assert_eq!(
            api_peer("http://host.docker.internal", gw),
            Ok(SocketAddrV4::new(gw, 80))
        );
        for bad in [
            "http://api.example.com:8080",
            "http://172.17.0.1:8080",
            "ftp://host.docker.internal:8080",
            "http://host.docker.internal:http",
        ] {
            let err = api_peer(bad, gw).unwrap_err();
            assert!(err.contains("172.18.0.1:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn chain_names_fit_iptables() {
        assert_eq!(HostFence::of("br-0123456789ab").chain().len(), 21);
        assert!(HostFence::of("abcdefghijklmno").chain().len() <= 28);
    }
}
