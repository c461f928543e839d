//! Property tests of the destination URL validator: it never panics, and
//! under the default policy it never accepts a URL whose host is an IP
//! literal in a forbidden range, however the literal is spelled.
//!
//! Case counts are small so these run in a second or two with the rest of
//! `cargo test`; `PROPTEST_CASES=100000` runs them longer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hookd_domain::destination::{DestinationPolicy, DestinationUrl, is_forbidden_ip};
use proptest::prelude::*;
use url::Host;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2048,
        // No regression files in the source tree: a failure prints its case.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The host of an accepted URL, as the validator saw it.
fn literal_host(d: &DestinationUrl) -> Option<IpAddr> {
    match d.url().host()? {
        Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        Host::Domain(_) => None,
    }
}

/// Under the default policy nothing accepted has a forbidden literal host
/// (and the same input never panics under any policy).
fn check(s: &str) -> Result<(), TestCaseError> {
    let _ = DestinationUrl::parse(s, DestinationPolicy::AllowPrivate);
    if let Ok(d) = DestinationUrl::parse(s, DestinationPolicy::PublicOnly) {
        if let Some(ip) = literal_host(&d) {
            prop_assert!(!is_forbidden_ip(ip), "accepted {s:?} with host {ip}");
        }
        prop_assert!(
            matches!(d.url().scheme(), "http" | "https"),
            "accepted {s:?}"
        );
        prop_assert!(d.url().username().is_empty() && d.url().password().is_none());
    }
    Ok(())
}

/// IPv4 addresses, most of them inside forbidden ranges.
fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    let in_net = |base: [u8; 4], prefix: u32| {
        any::<u32>().prop_map(move |r| {
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix)
            };
            Ipv4Addr::from((u32::from(Ipv4Addr::from(base)) & mask) | (r & !mask))
        })
    };
    prop_oneof![
        any::<u32>().prop_map(Ipv4Addr::from),
        in_net([127, 0, 0, 0], 8),
        in_net([10, 0, 0, 0], 8),
        in_net([172, 16, 0, 0], 12),
        in_net([192, 168, 0, 0], 16),
        in_net([169, 254, 0, 0], 16),
        in_net([100, 64, 0, 0], 10),
        in_net([0, 0, 0, 0], 8),
        in_net([224, 0, 0, 0], 4),
        in_net([240, 0, 0, 0], 4),
        in_net([198, 18, 0, 0], 15),
        in_net([192, 0, 2, 0], 24),
        in_net([198, 51, 100, 0], 24),
        in_net([203, 0, 113, 0], 24),
        Just(Ipv4Addr::new(169, 254, 169, 254)),
        Just(Ipv4Addr::BROADCAST),
    ]
}

/// The ways an IPv4 address can be written in a URL's host.
fn spellings(ip: Ipv4Addr) -> Vec<String> {
    let [a, b, c, d] = ip.octets();
    let n = u32::from(ip);
    let v4 = |x: u32| Ipv6Addr::from(u128::from(x));
    vec![
        ip.to_string(),
        n.to_string(),                                      // decimal
        format!("{n:#x}"),                                  // hex
        format!("{n:#o}").replace("0o", "0"),               // octal
        format!("0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}"),         // hex parts
        format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),             // octal parts
        format!("{a}.{}", n & 0x00ff_ffff),                 // a.bcd
        format!("{a}.{b}.{}", n & 0xffff),                  // a.b.cd
        format!("[{}]", ip.to_ipv6_mapped()),               // ::ffff:a.b.c.d
        format!("[::ffff:{:x}:{:x}]", n >> 16, n & 0xffff), // mapped, hex
        format!("[{}]", v4(n)),                             // ::a.b.c.d
        format!("[64:ff9b::{ip}]"),                         // NAT64
        format!("[0:0:0:0:0:ffff:{ip}]"),                   // mapped, long
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Any string at all.
    #[test]
    fn arbitrary_strings_never_panic_nor_pass_a_forbidden_literal(s in any::<String>()) {
        check(&s)?;
    }

    /// Strings shaped like URLs, so the parser gets past the scheme.
    #[test]
    fn url_shaped_strings_never_panic_nor_pass_a_forbidden_literal(
        scheme in prop_oneof![Just("http"), Just("https"), Just("HTTP"), Just("ftp"), Just("file")],
        sep in prop_oneof![Just("://"), Just(":/"), Just(":"), Just(":///"), Just(":\\\\")],
        userinfo in prop_oneof![Just(""), Just("u@"), Just("u:p@"), Just(":@"), Just("@")],
        host in "[a-zA-Z0-9.:%\\[\\]\\-_~@]{0,40}",
        port in prop_oneof![Just(String::new()), (0u32..70_000).prop_map(|p| format!(":{p}"))],
        path in "(/[ -~]{0,20}){0,3}",
    ) {
        check(&format!("{scheme}{sep}{userinfo}{host}{port}{path}"))?;
    }

    /// Every spelling of an IPv4 address is judged as that address: refused
    /// when it is forbidden, and whatever is accepted is public.
    #[test]
    fn every_spelling_of_a_forbidden_ipv4_is_refused(
        ip in ipv4(),
        scheme in prop_oneof![Just("http"), Just("https")],
        port in prop_oneof![Just(""), Just(":443"), Just(":8080")],
    ) {
        for host in spellings(ip) {
            let s = format!("{scheme}://{host}{port}/hook");
            check(&s)?;
            if is_forbidden_ip(IpAddr::V4(ip)) {
                prop_assert!(
                    DestinationUrl::parse(&s, DestinationPolicy::PublicOnly).is_err(),
                    "accepted {s:?}, a spelling of forbidden {ip}"
                );
            }
        }
    }

    /// Arbitrary IPv6 literals: accepted only when public.
    #[test]
    fn ipv6_literals_are_accepted_only_when_public(bits in any::<u128>(), prefix in prop_oneof![
        Just(0u128), Just(0xfe80u128 << 112), Just(0xfc00u128 << 112), Just(0xff00u128 << 112),
        Just(0x0064_ff9bu128 << 96), Just(0xffffu128 << 32), Just(0x2002u128 << 112),
    ]) {
        let ip = Ipv6Addr::from(if prefix == 0 { bits } else { prefix | (bits & 0xffff_ffff) });
        let s = format!("https://[{ip}]/");
        check(&s)?;
        let accepted = DestinationUrl::parse(&s, DestinationPolicy::PublicOnly).is_ok();
        prop_assert_eq!(accepted, !is_forbidden_ip(IpAddr::V6(ip)), "{}", s);
    }
}
