//! A subscription's URL, parsed once into a trusted [`DestinationUrl`].
//!
//! The *destination* is the URL's host (without port): the unit of politeness
//! that concurrency caps, circuit breakers and rate limits are keyed on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use ipnet::IpNet;
use url::{Host, Url};

/// The longest URL accepted, in bytes.
pub const MAX_URL_LEN: usize = 2048;

/// Why a URL was refused as a destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDestination {
    /// Not a URL at all.
    #[error("url is not a valid absolute URL: {0}")]
    Malformed(String),
    /// Longer than [`MAX_URL_LEN`].
    #[error("url is longer than {MAX_URL_LEN} bytes")]
    TooLong,
    /// Not http or https.
    #[error("url scheme must be http or https, not `{0}`")]
    Scheme(String),
    /// No host.
    #[error("url has no host")]
    NoHost,
    /// `user:pass@` in the URL.
    #[error("url must not carry credentials (user:password@)")]
    Credentials,
    /// A loopback, private, link-local or otherwise non-public address.
    #[error(
        "url points at a non-public address ({0}); hookd refuses private destinations unless it is started with --allow-destination-cidr covering it or --allow-private-destinations"
    )]
    Forbidden(String),
}

/// Which addresses hookd may call: checked when a subscription's URL is
/// created or changed (IP literals) and again for every new connection
/// (every address a host name resolves to; see `hookd-dispatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestinationPolicy {
    /// Only public addresses (the default): nothing [`is_forbidden_ip`]
    /// refuses.
    PublicOnly,
    /// Public addresses, and forbidden ones inside the allowlist's CIDRs
    /// (`--allow-destination-cidr`).
    PublicOnlyExcept(Allowlist),
    /// Any address: for development and tests.
    AllowPrivate,
}

impl DestinationPolicy {
    /// Public addresses only, except those in `allow` (plain
    /// [`PublicOnly`](Self::PublicOnly) when it is empty).
    pub fn public_only(allow: Vec<IpNet>) -> Self {
        if allow.is_empty() {
            Self::PublicOnly
        } else {
            Self::PublicOnlyExcept(Allowlist::new(allow))
        }
    }

    /// Whether hookd may connect to `ip`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        match self {
            Self::AllowPrivate => true,
            Self::PublicOnly => !is_forbidden_ip(ip),
            Self::PublicOnlyExcept(allow) => !is_forbidden_ip(ip) || allow.contains(ip),
        }
    }

    /// Whether addresses are checked at all (not under
    /// [`AllowPrivate`](Self::AllowPrivate)).
    pub fn checks_addresses(&self) -> bool {
        !matches!(self, Self::AllowPrivate)
    }
}

/// CIDRs whose addresses are allowed although [`is_forbidden_ip`] refuses
/// them. Built once from the configuration and kept for the life of the
/// process (so [`DestinationPolicy`] stays `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowlist(&'static [IpNet]);

impl Allowlist {
    /// An allowlist of `nets`. Its memory lives as long as the process:
    /// build it from configuration, not per request.
    pub fn new(nets: Vec<IpNet>) -> Self {
        Self(Box::leak(nets.into_boxed_slice()))
    }

    /// The CIDRs.
    pub fn nets(&self) -> &[IpNet] {
        self.0
    }

    /// Whether `ip` (or, for an IPv4-mapped IPv6 address, its IPv4 form) is
    /// inside one of the CIDRs.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let canonical = ip.to_canonical();
        self.0
            .iter()
            .any(|net| net.contains(&ip) || net.contains(&canonical))
    }
}

/// Parses a `--allow-destination-cidr` value: a CIDR (`10.1.0.0/16`,
/// `fd00::/8`) or a single address (`127.0.0.2`, as a /32 or /128).
pub fn parse_cidr(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{s}` is not a CIDR (like 10.1.0.0/16) or an IP address"))
}

/// A validated destination URL and its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationUrl {
    url: Url,
    host: String,
}

impl DestinationUrl {
    /// Parses and validates a subscription URL under `policy`.
    pub fn parse(s: &str, policy: DestinationPolicy) -> Result<Self, InvalidDestination> {
        if s.len() > MAX_URL_LEN {
            return Err(InvalidDestination::TooLong);
        }
        let url = Url::parse(s).map_err(|e| InvalidDestination::Malformed(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(InvalidDestination::Scheme(
                url.scheme().chars().take(32).collect(),
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(InvalidDestination::Credentials);
        }
        // The `url` crate (WHATWG URL parsing) has already turned every IPv4
        // spelling — decimal `2130706433`, octal `0177.0.0.1`, hex `0x7f.1`,
        // shortened `127.1` — into `Host::Ipv4`, so one check covers them.
        let host = url.host().ok_or(InvalidDestination::NoHost)?;
        if policy.checks_addresses() {
            let forbidden = match &host {
                Host::Ipv4(ip) => !policy.permits(IpAddr::V4(*ip)),
                Host::Ipv6(ip) => !policy.permits(IpAddr::V6(*ip)),
                Host::Domain(d) => {
                    let d = d.trim_end_matches('.');
                    d == "localhost" || d.ends_with(".localhost")
                }
            };
            if forbidden {
                return Err(InvalidDestination::Forbidden(host.to_string()));
            }
        }
        let host = match host {
            Host::Domain(d) => d.trim_end_matches('.').to_ascii_lowercase(),
            Host::Ipv4(ip) => ip.to_string(),
            Host::Ipv6(ip) => ip.to_string(),
        };
        Ok(Self { url, host })
    }

    /// Re-wraps a URL read back from the store, where it was validated on the
    /// way in. Only the store may use this.
    pub fn from_stored(s: &str) -> Result<Self, InvalidDestination> {
        Self::parse(s, DestinationPolicy::AllowPrivate)
    }

    /// The URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The URL as text.
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// The destination host (lower-case, no port).
    pub fn host(&self) -> &str {
        &self.host
    }
}

/// Whether an address is not a public unicast address: loopback, private,
/// link-local (incl. cloud metadata), CGNAT, unspecified, multicast,
/// broadcast, benchmarking, documentation, IPv6 unique-local, and the
/// IPv4-mapped / IPv4-compatible / NAT64 forms of any of these.
pub fn is_forbidden_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => is_forbidden_v6(v6),
    }
}

fn is_forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments 192.0.0/24
        || (a == 198 && (b == 18 || b == 19)) // benchmarking 198.18/15
        || a >= 240 // reserved, and broadcast 255.255.255.255
        || CLOUD_METADATA_V4.contains(&ip)
}

/// Cloud metadata and platform endpoints outside the ranges above (AWS,
/// GCP, Azure IMDS and Oracle use 169.254.169.254, link-local; Alibaba's
/// 100.100.100.200 is in CGNAT; AWS's IPv6 fd00:ec2::254 is unique-local).
const CLOUD_METADATA_V4: [Ipv4Addr; 1] = [
    Ipv4Addr::new(168, 63, 129, 16), // Azure WireServer
];

fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_forbidden_v4(v4);
    }
    let seg = ip.segments();
    // NAT64 local-use 64:ff9b:1::/48 (RFC 8215): a private translator.
    if seg[..3] == [0x64, 0xff9b, 1] {
        return true;
    }
    // 6to4 2002::/16 carries an IPv4 address in its next 32 bits.
    if seg[0] == 0x2002 {
        let v4 = Ipv4Addr::new(
            (seg[1] >> 8) as u8,
            seg[1] as u8,
            (seg[2] >> 8) as u8,
            seg[2] as u8,
        );
        return is_forbidden_v4(v4);
    }
    // IPv4-compatible ::a.b.c.d (deprecated) and NAT64 64:ff9b::/96.
    if seg[..6] == [0, 0, 0, 0, 0, 0] || seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let v4 = Ipv4Addr::new(
            (seg[6] >> 8) as u8,
            seg[6] as u8,
            (seg[7] >> 8) as u8,
            seg[7] as u8,
        );
        return ip.is_loopback() || ip.is_unspecified() || is_forbidden_v4(v4);
    }
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (seg[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (seg[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        || (seg[0] == 0x2001 && seg[1] == 0x0002 && seg[2] == 0) // benchmarking
        || (seg[0] == 0x0100 && seg[1..4] == [0, 0, 0]) // discard-only 100::/64
}

/// One URL of every forbidden range and spelling, for tests at every layer:
/// creation refuses each; the connect-time tests answer each address (its
/// spellings normalised) from a rebinding resolver.
pub const FORBIDDEN_EXAMPLES: &[&str] = &[
    // IPv4 loopback, RFC 1918, link-local and cloud metadata.
    "http://127.0.0.1/",
    "http://127.255.255.254:8080/",
    "http://10.0.0.1/",
    "http://10.255.255.255/",
    "http://172.16.0.1/",
    "http://172.31.255.255/",
    "http://192.168.1.1/",
    "http://169.254.0.1/",
    "http://169.254.169.254/latest/meta-data",
    "http://168.63.129.16/",
    // CGNAT 100.64/10 (incl. Alibaba's metadata 100.100.100.200).
    "http://100.64.0.1/",
    "http://100.100.100.200/",
    "http://100.127.255.255/",
    // Unspecified, "this network", multicast, broadcast, reserved.
    "http://0.0.0.0/",
    "http://0.1.2.3/",
    "http://224.0.0.1/",
    "http://239.255.255.250/",
    "http://255.255.255.255/",
    "http://240.0.0.1/",
    "http://192.0.0.1/",
    // Benchmarking 198.18/15, documentation.
    "http://198.18.0.1/",
    "http://198.19.255.255/",
    "http://192.0.2.1/",
    "http://198.51.100.7/",
    "http://203.0.113.9/",
    // Decimal, octal, hex and shortened IPv4 spellings (the `url` crate
    // normalises each to 127.0.0.1, 10.0.0.1 or 0.0.0.0).
    "http://2130706433/",
    "http://0x7f.1/",
    "http://017700000001/",
    "http://127.1/",
    "http://0x7f000001/",
    "http://0x7f.0.0.1/",
    "http://0177.0.0.1/",
    "http://0177.0.1/",
    "http://10.1/",
    "http://0/",
    "http://0x0a.0x00.0x00.0x01/",
    // IPv6 loopback, unspecified, link-local, unique-local, multicast,
    // documentation, and AWS's IPv6 metadata address.
    "http://[::1]/",
    "http://[::]/",
    "http://[fe80::1]/",
    "http://[febf:ffff::1]/",
    "http://[fc00::1]/",
    "http://[fd00::1]/",
    "http://[fd00:ec2::254]/",
    "http://[ff02::1]/",
    "http://[2001:db8::1]/",
    // IPv4-mapped ::ffff:a.b.c.d.
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:100.64.0.1]/",
    "http://[::ffff:0.0.0.0]/",
    // IPv4-compatible ::a.b.c.d.
    "http://[::127.0.0.1]/",
    "http://[::10.0.0.1]/",
    "http://[::169.254.169.254]/",
    // NAT64 64:ff9b::/96, and the local-use 64:ff9b:1::/48.
    "http://[64:ff9b::127.0.0.1]/",
    "http://[64:ff9b::a00:1]/",
    "http://[64:ff9b::169.254.169.254]/",
    "http://[64:ff9b::192.168.0.1]/",
    "http://[64:ff9b:1::1]/",
    "http://[64:ff9b:1::93.184.216.34]/",
    // 6to4 2002::/16 around a forbidden IPv4 address.
    "http://[2002:7f00:1::1]/",
    "http://[2002:a9fe:a9fe::]/",
    // Local names.
    "http://localhost:8080/",
    "http://LOCALHOST./",
    "http://api.localhost/",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_lower_case_without_port() {
        let d = DestinationUrl::parse(
            "https://Hooks.Example.COM:8443/a?b=1",
            DestinationPolicy::PublicOnly,
        )
        .unwrap();
        assert_eq!(d.host(), "hooks.example.com");
    }

    #[test]
    fn bad_urls_are_refused_with_a_reason() {
        use InvalidDestination::*;
        let p = DestinationPolicy::PublicOnly;
        assert!(matches!(
            DestinationUrl::parse("ftp://x.com/", p),
            Err(Scheme(_))
        ));
        assert!(matches!(
            DestinationUrl::parse("not a url", p),
            Err(Malformed(_))
        ));
        assert!(matches!(
            DestinationUrl::parse("https://u:p@x.com/", p),
            Err(Credentials)
        ));
        assert!(matches!(
            DestinationUrl::parse(&format!("https://x.com/{}", "a".repeat(3000)), p),
            Err(TooLong)
        ));
    }

    /// Every forbidden form the issue lists, as a URL literal.

    #[test]
    fn every_forbidden_form_is_refused_at_creation_unless_private_is_allowed() {
        for url in FORBIDDEN_EXAMPLES {
            assert!(
                matches!(
                    DestinationUrl::parse(url, DestinationPolicy::PublicOnly),
                    Err(InvalidDestination::Forbidden(_))
                ),
                "{url} must be refused"
            );
            assert!(
                DestinationUrl::parse(url, DestinationPolicy::AllowPrivate).is_ok(),
                "{url} is allowed with AllowPrivate"
            );
        }
    }

    #[test]
    fn public_looking_addresses_are_accepted() {
        for url in [
            "http://93.184.216.34/",
            "https://93.184.216.34:8443/hook",
            "http://8.8.8.8/",
            "http://[2606:4700::1]/",
            "http://[2606:4700:4700::1111]:8080/",
            "http://[::ffff:93.184.216.34]/",
            "http://[64:ff9b::93.184.216.34]/",
            "http://[2002:5db8:d822::1]/",
            "https://hooks.example.com/a",
            // A name is judged by what it resolves to, at connect time.
            "https://internal.example/",
            "http://1.2.3.4.nip.io/",
        ] {
            let d = DestinationUrl::parse(url, DestinationPolicy::PublicOnly);
            assert!(d.is_ok(), "{url}: {d:?}");
        }
    }

    #[test]
    fn ipv4_spellings_are_normalised_before_the_check() {
        for (url, host) in [
            ("http://2130706433/", "127.0.0.1"),
            ("http://0x7f.1/", "127.0.0.1"),
            ("http://017700000001/", "127.0.0.1"),
            ("http://127.1/", "127.0.0.1"),
            ("http://0177.0.1/", "127.0.0.1"),
            ("http://10.1/", "10.0.0.1"),
            ("http://0/", "0.0.0.0"),
        ] {
            let d = DestinationUrl::parse(url, DestinationPolicy::AllowPrivate).unwrap();
            assert_eq!(d.host(), host, "{url}");
            assert_eq!(d.url().host(), Some(Host::Ipv4(host.parse().unwrap())));
        }
    }

    #[test]
    fn schemes_and_credentials_are_refused_before_the_address() {
        use InvalidDestination::*;
        for policy in [
            DestinationPolicy::PublicOnly,
            DestinationPolicy::AllowPrivate,
        ] {
            for url in [
                "file:///etc/passwd",
                "gopher://93.184.216.34/",
                "ftp://93.184.216.34/",
                "ws://93.184.216.34/",
                "javascript:alert(1)",
                "data:text/plain,hi",
            ] {
                assert!(
                    matches!(DestinationUrl::parse(url, policy), Err(Scheme(_))),
                    "{url}"
                );
            }
            for url in [
                "https://user@93.184.216.34/",
                "https://:pw@example.com/",
                "https://u:p@example.com/",
            ] {
                assert!(
                    matches!(DestinationUrl::parse(url, policy), Err(Credentials)),
                    "{url}"
                );
            }
        }
    }

    #[test]
    fn the_allowlist_exempts_exactly_its_cidrs() {
        let policy = DestinationPolicy::public_only(vec![
            parse_cidr("127.0.0.2").unwrap(),
            parse_cidr("10.1.0.0/16").unwrap(),
            parse_cidr("fd00:ec2::/32").unwrap(),
        ]);
        for url in [
            "http://127.0.0.2:9000/",
            "http://[::ffff:127.0.0.2]/",
            "http://10.1.200.3/",
            "http://[fd00:ec2::254]/",
            "http://93.184.216.34/",
        ] {
            assert!(DestinationUrl::parse(url, policy).is_ok(), "{url}");
        }
        for url in [
            "http://127.0.0.1/",
            "http://127.0.0.3/",
            "http://10.2.0.1/",
            "http://169.254.169.254/",
            "http://[fd00::1]/",
            "http://localhost/",
        ] {
            assert!(
                matches!(
                    DestinationUrl::parse(url, policy),
                    Err(InvalidDestination::Forbidden(_))
                ),
                "{url}"
            );
        }
        assert_eq!(
            DestinationPolicy::public_only(vec![]),
            DestinationPolicy::PublicOnly
        );
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("example.com").is_err());
    }

    #[test]
    fn policies_judge_resolved_addresses() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = DestinationPolicy::PublicOnly;
        assert!(!p.permits(ip("127.0.0.1")));
        assert!(!p.permits(ip("::ffff:169.254.169.254")));
        assert!(p.permits(ip("93.184.216.34")));
        assert!(p.permits(ip("2606:4700::1")));
        assert!(DestinationPolicy::AllowPrivate.permits(ip("127.0.0.1")));
        assert!(!DestinationPolicy::AllowPrivate.checks_addresses());
        assert!(p.checks_addresses());
    }
}
