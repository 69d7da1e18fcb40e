//! Which resolved addresses the proxy connects to. A name on the
//! allowlist can still resolve (by its owner's choice or a poisoned
//! record) to the host, the api or the private network around it, so the
//! address is checked after resolution, by the proxy, never taken from
//! the client.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The proxy's rule for addresses.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    /// Admit loopback, private (RFC 1918, unique local), link-local and
    /// shared (100.64/10) addresses too: for an allowlist of names inside
    /// the operator's own network (`--egress-allow-private`).
    pub allow_private: bool,
    /// Refused whatever `allow_private` says: the api's and the host's own
    /// addresses as sandboxes see them (the sandbox network's gateway).
    pub refused: Vec<IpAddr>,
}

impl AddressPolicy {
    pub fn admits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        if self.refused.iter().any(|r| canonical(*r) == ip) || never(ip) {
            return false;
        }
        self.allow_private || !non_global(ip)
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Never a destination: unspecified, broadcast, multicast.
fn never(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
        IpAddr::V6(v6) => v6.is_unspecified() || v6.is_multicast(),
    }
}

fn non_global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_non_global(v4),
        IpAddr::V6(v6) => v6_non_global(v6),
    }
}

fn v4_non_global(v4: Ipv4Addr) -> bool {
    let [a, b, ..] = v4.octets();
    v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && v4.octets()[2] == 0)
        || a >= 240
}

fn v6_non_global(v6: Ipv6Addr) -> bool {
    let first = v6.segments()[0];
    v6.is_loopback()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
        // NAT64 and 6to4 can embed any IPv4 address, private ones included.
        || (first == 0x0064 && v6.segments()[1] == 0xff9b)
        || first == 0x2002
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn non_global_addresses_are_refused_by_default() {
        let policy = AddressPolicy::default();
        for refused in [
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "febf::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
        ] {
            assert!(!policy.admits(ip(refused)), "{refused}");
        }
        for admitted in [
            "1.1.1.1",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "192.0.1.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert!(policy.admits(ip(admitted)), "{admitted}");
        }
    }

    #[test]
    fn allow_private_admits_private_but_never_the_refused_or_the_impossible() {
        let policy = AddressPolicy {
            allow_private: true,
            refused: vec![ip("172.18.0.1")],
        };
        assert!(policy.admits(ip("127.0.0.1")));
        assert!(policy.admits(ip("10.0.0.1")));
        assert!(policy.admits(ip("172.18.0.2")));
        assert!(!policy.admits(ip("172.18.0.1")));
        assert!(!policy.admits(ip("::ffff:172.18.0.1")));
        assert!(!policy.admits(ip("0.0.0.0")));
        assert!(!policy.admits(ip("224.0.0.1")));
        assert!(!policy.admits(ip("::")));
    }
}
