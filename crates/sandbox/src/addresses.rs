//! Which network addresses a sandbox may reach through its egress proxy: the public
//! internet only. The host itself, its LAN, link-local ranges (where cloud metadata
//! services live), unique-local and multicast ranges are internal, whatever name a
//! session's allow-list uses for them; only the operator can open one, by name, in the
//! server's own configuration.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why `ip` is internal (`None` when it is a public address).
pub fn internal_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b) {
        _ if ip.is_loopback() => "a loopback address",
        _ if ip.is_unspecified() || a == 0 => "an unspecified address",
        _ if ip.is_private() => "a private address",
        _ if ip.is_link_local() => "a link-local (metadata) address",
        _ if ip.is_multicast() => "a multicast address",
        _ if ip.is_broadcast() || a >= 240 => "a reserved address",
        (100, 64..=127) => "a carrier-grade NAT address",
        (198, 18..=19) => "a benchmarking address",
        (192, 0) if c == 0 || c == 2 => "a special-purpose address",
        (198, 51) if c == 100 => "a documentation address",
        (203, 0) if c == 113 => "a documentation address",
        _ => return None,
    })
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_kind(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) and IPv4-compatible (::a.b.c.d) addresses embed an IPv4 one.
    if (s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4]) || s[0..6] == [0; 6] {
        let embedded = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        if !ip.is_loopback() && !ip.is_unspecified() {
            return v4_kind(embedded).or(Some("an IPv4-embedding address"));
        }
    }
    Some(match s[0] {
        _ if ip.is_loopback() => "a loopback address",
        _ if ip.is_unspecified() => "an unspecified address",
        x if x & 0xfe00 == 0xfc00 => "a unique-local address",
        x if x & 0xffc0 == 0xfe80 => "a link-local address",
        x if x & 0xffc0 == 0xfec0 => "a site-local address",
        x if x & 0xff00 == 0xff00 => "a multicast address",
        0x2001 if s[1] == 0xdb8 => "a documentation address",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> Option<&'static str> {
        internal_kind(text.parse().unwrap())
    }

    #[test]
    fn internal_ranges_are_recognised_in_every_spelling() {
        for internal in [
            "127.0.0.1",
            "127.255.0.9",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
        ] {
            assert!(kind(internal).is_some(), "{internal} must be internal");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "151.101.0.223",
            "2606:4700:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert_eq!(kind(public), None, "{public} is public");
        }
        assert_eq!(
            kind("169.254.169.254"),
            Some("a link-local (metadata) address")
        );
    }
}
