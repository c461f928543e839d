//! Where attempts may go: the connect-time half of SSRF protection.
//!
//! A subscription's URL is checked when it is created (`hookd-domain`'s
//! `DestinationUrl::parse` refuses forbidden IP literals), but a host *name*
//! can resolve to anything, and to something else tomorrow (DNS rebinding).
//! So every new connection resolves its host through [`CheckedResolver`],
//! which refuses the whole lookup if **any** address it got is forbidden by
//! the [`DestinationPolicy`]. hyper-util's connector then connects to
//! exactly the addresses this resolver returned and resolves nothing
//! itself, so the address that was checked is the address that is used:
//! there is no second lookup an attacker's DNS server could answer
//! differently.
//!
//! Two paths bypass this resolver and are checked by the
//! [`Sender`](crate::send::Sender) before it sends:
//! - an IP-literal host (hyper does not resolve literals), checked against
//!   the current policy, which may be stricter than when the URL was stored;
//! - an outbound proxy ([`Egress::proxy`]): the proxy resolves the target,
//!   not hookd. hookd resolves and checks the host just before sending, but
//!   the proxy's own lookup happens later and could be answered differently
//!   (a residual rebinding window): a proxy must enforce its own egress
//!   rules too.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use async_trait::async_trait;
use hookd_domain::destination::DestinationPolicy;
use hyper_util::client::legacy::connect::dns::Name;

/// Looks host names up. The seam through which tests answer what they like
/// (e.g. a forbidden address, as a rebinding DNS server would).
#[async_trait]
pub trait HostResolver: Send + Sync + fmt::Debug {
    /// Every address `host` resolves to.
    async fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The operating system's resolver (`getaddrinfo`, via tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl HostResolver for SystemResolver {
    async fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, 0))
            .await?
            .map(|a| a.ip())
            .collect())
    }
}

/// A resolver with fixed answers, for tests: names it does not know do not
/// resolve. Counts its lookups.
#[derive(Debug, Default)]
pub struct StaticResolver {
    answers: std::collections::HashMap<String, Vec<IpAddr>>,
    lookups: std::sync::atomic::AtomicUsize,
}

impl StaticResolver {
    /// Answers each `(name, addresses)`.
    pub fn new<'a>(answers: impl IntoIterator<Item = (&'a str, Vec<IpAddr>)>) -> Self {
        Self {
            answers: answers
                .into_iter()
                .map(|(n, a)| (n.to_ascii_lowercase(), a))
                .collect(),
            lookups: Default::default(),
        }
    }

    /// How many lookups it answered (or refused).
    pub fn lookups(&self) -> usize {
        self.lookups.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait]
impl HostResolver for StaticResolver {
    async fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.answers
            .get(&host.to_ascii_lowercase())
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "unknown name"))
    }
}

/// How attempts leave the process.
#[derive(Clone)]
pub struct Egress {
    /// Which addresses may be called. `AllowPrivate` turns the connect-time
    /// check off.
    pub policy: DestinationPolicy,
    /// Resolves destination host names.
    pub resolver: Arc<dyn HostResolver>,
    /// Send every attempt through this HTTP(S) proxy (`http://host:port`).
    /// Without one, proxy environment variables (`HTTPS_PROXY`, …) are
    /// ignored.
    pub proxy: Option<String>,
}

impl fmt::Debug for Egress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The proxy URL may carry credentials: say only whether there is one.
        f.debug_struct("Egress")
            .field("policy", &self.policy)
            .field("resolver", &self.resolver)
            .field("proxy", &self.proxy.as_ref().map(|_| "<configured>"))
            .finish()
    }
}

impl Default for Egress {
    /// Public destinations only, the system resolver, no proxy.
    fn default() -> Self {
        Self {
            policy: DestinationPolicy::PublicOnly,
            resolver: Arc::new(SystemResolver),
            proxy: None,
        }
    }
}

/// An attempt refused because its destination is (or resolves to) an
/// address the policy forbids. Recorded as `forbidden_destination`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("forbidden destination: {host} is {addr}, which hookd does not call")]
pub struct ForbiddenAddress {
    /// The host of the URL.
    pub host: String,
    /// The first forbidden address.
    pub addr: IpAddr,
}

/// Why a checked lookup gave no addresses.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// A resolved address is forbidden.
    #[error(transparent)]
    Forbidden(#[from] ForbiddenAddress),
    /// The name did not resolve.
    #[error("dns error: {host} did not resolve")]
    Dns {
        /// The name.
        host: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Checks `addrs` (what `host` is) against `policy`: all must be allowed.
pub fn check_addrs(
    policy: &DestinationPolicy,
    host: &str,
    addrs: &[IpAddr],
) -> Result<(), ForbiddenAddress> {
    match addrs.iter().find(|ip| !policy.permits(**ip)) {
        Some(addr) => Err(ForbiddenAddress {
            host: host.to_owned(),
            addr: *addr,
        }),
        None => Ok(()),
    }
}

/// Resolves `host` and checks every address it got.
pub async fn resolve_checked(
    resolver: &dyn HostResolver,
    policy: &DestinationPolicy,
    host: &str,
) -> Result<Vec<IpAddr>, LookupError> {
    let addrs = resolver
        .lookup(host)
        .await
        .map_err(|source| LookupError::Dns {
            host: host.to_owned(),
            source,
        })?;
    if addrs.is_empty() {
        return Err(LookupError::Dns {
            host: host.to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no addresses"),
        });
    }
    check_addrs(policy, host, &addrs)?;
    Ok(addrs)
}

/// The HTTP connector's resolver: resolves through a [`HostResolver`] and
/// refuses the connection if any address is forbidden.
///
/// hyper-util's connector connects to exactly the addresses returned here
/// (with the URL's port), so the checked address is the one connected to.
/// It is asked for every new connection (pooled connections were checked
/// when made).
#[derive(Debug, Clone)]
pub struct CheckedResolver {
    resolver: Arc<dyn HostResolver>,
    policy: DestinationPolicy,
}

impl CheckedResolver {
    /// Resolves through `resolver` under `policy`.
    pub fn new(resolver: Arc<dyn HostResolver>, policy: DestinationPolicy) -> Self {
        Self { resolver, policy }
    }
}

impl tower_service::Service<Name> for CheckedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let resolver = self.resolver.clone();
        let policy = self.policy;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // A refusal goes back as the bare `ForbiddenAddress`, so the
            // sender finds it in the connector's error chain.
            let addrs = resolve_checked(resolver.as_ref(), &policy, &host)
                .await
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> {
                    match e {
                        LookupError::Forbidden(f) => Box::new(f),
                        dns => Box::new(dns),
                    }
                })?;
            // Port 0: the connector puts the URL's port in.
            Ok(addrs
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_forbidden_address_refuses_the_whole_lookup() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = DestinationPolicy::PublicOnly;
        assert!(check_addrs(&p, "a.example", &[ip("93.184.216.34")]).is_ok());
        let err = check_addrs(
            &p,
            "a.example",
            &[ip("93.184.216.34"), ip("::ffff:10.0.0.1")],
        )
        .unwrap_err();
        assert_eq!(err.addr, ip("::ffff:10.0.0.1"));
        assert!(
            check_addrs(
                &DestinationPolicy::AllowPrivate,
                "a.example",
                &[ip("127.0.0.1")]
            )
            .is_ok()
        );
    }
}
