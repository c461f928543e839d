//! A subscription's URL, parsed once into a trusted [`DestinationUrl`].
//!
//! The *destination* is the URL's host (without port): the unit of politeness
//! that concurrency caps, circuit breakers and rate limits are keyed on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
        "url points at a non-public address ({0}); hookd refuses private destinations unless started with --allow-private-destinations"
    )]
    Forbidden(String),
}

/// Whether private destinations (loopback, RFC 1918, link-local, …) may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestinationPolicy {
    /// Only public addresses (the default).
    PublicOnly,
    /// Any address: for development and tests.
    AllowPrivate,
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
        let host = url.host().ok_or(InvalidDestination::NoHost)?;
        if policy == DestinationPolicy::PublicOnly {
            let forbidden = match &host {
                Host::Ipv4(ip) => is_forbidden_ip(IpAddr::V4(*ip)),
                Host::Ipv6(ip) => is_forbidden_ip(IpAddr::V6(*ip)),
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
        || a >= 240 // reserved
}

fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_forbidden_v4(v4);
    }
    let seg = ip.segments();
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

    #[test]
    fn private_literals_are_refused_unless_allowed() {
        for url in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f.0.0.1/",
            "http://0177.0.0.1/",
            "http://10.0.0.1/",
            "http://192.168.1.1/",
            "http://172.16.0.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[64:ff9b::a00:1]/",
            "http://localhost:8080/",
        ] {
            assert!(
                matches!(
                    DestinationUrl::parse(url, DestinationPolicy::PublicOnly),
                    Err(InvalidDestination::Forbidden(_))
                ),
                "{url}"
            );
            assert!(
                DestinationUrl::parse(url, DestinationPolicy::AllowPrivate).is_ok(),
                "{url}"
            );
        }
        assert!(
            DestinationUrl::parse("http://93.184.216.34/", DestinationPolicy::PublicOnly).is_ok()
        );
    }
}
