//! The small HTTP client the API-talking commands share (`hookd replay`,
//! `hookd subscriptions …`, `events`, `deliveries`, `health`): where the
//! server is, the bearer token, and turning the API's error body into an
//! error that says what the API said.

use anyhow::Context as _;
use clap::Args;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Where `hookd serve` listens unless told otherwise.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// How to reach a running `hookd serve` (global to a command's subcommands).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The hookd API.
    #[arg(long, env = "HOOKD_URL", default_value = DEFAULT_SERVER, global = true)]
    pub server: String,
    /// An admin token, or a customer's.
    #[arg(long, env = "HOOKD_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

/// The API's error body: `{"error": {"code", "message"}}`.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
}

/// A successful (2xx) answer.
#[derive(Debug)]
pub struct Answer {
    /// The body, exactly as the API sent it (empty for `204`).
    pub text: String,
}

impl Answer {
    /// The body as `T`.
    pub fn json<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        serde_json::from_str(&self.text).context("reading the API's answer")
    }
}

/// A client of one hookd server, acting with one token.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Client {
    /// A client for `args`; fails without a token.
    pub fn new(args: &ServerArgs) -> anyhow::Result<Self> {
        let token = args
            .token
            .clone()
            .filter(|t| !t.is_empty())
            .context("no API token: pass --token or set HOOKD_TOKEN")?;
        Ok(Self {
            base: args.server.trim_end_matches('/').to_owned(),
            token,
            http: reqwest::Client::new(),
        })
    }

    /// `GET path` (with `query`, skipping absent values).
    pub async fn get(
        &self,
        path: &str,
        query: &[(&str, Option<String>)],
    ) -> anyhow::Result<Answer> {
        let mut url = reqwest::Url::parse(&self.url(path))
            .with_context(|| format!("{} is not a URL", self.base))?;
        for (k, v) in query {
            if let Some(v) = v {
                url.query_pairs_mut().append_pair(k, v);
            }
        }
        self.send(self.http.get(url)).await
    }

    /// `POST path` with a JSON body.
    pub async fn post<B: serde::Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<Answer> {
        self.send(self.http.post(self.url(path)).json(body)).await
    }

    /// `POST path` without a body.
    pub async fn post_empty(&self, path: &str) -> anyhow::Result<Answer> {
        self.send(self.http.post(self.url(path))).await
    }

    /// `PATCH path` with a JSON body.
    pub async fn patch<B: serde::Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<Answer> {
        self.send(self.http.patch(self.url(path)).json(body)).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> anyhow::Result<Answer> {
        self.send(self.http.delete(self.url(path))).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Answer> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("reaching the hookd API at {}", self.base))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .with_context(|| format!("reading the answer from {}", self.base))?;
        if status.is_success() {
            return Ok(Answer { text });
        }
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => anyhow::bail!("{status}: {} ({})", b.error.message, b.error.code),
            Err(_) => anyhow::bail!("{status}: {text}"),
        }
    }
}

/// `s` as one path segment: anything but unreserved characters is
/// percent-encoded, so an id typed by hand cannot change the route.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
