//! Extractors that fail with [`ApiError`] only, so axum's plain-text
//! rejections never reach a client.
//!
//! - [`JsonBody`]: checks the content type, reads the body itself under
//!   `max_body_bytes`, and deserializes with `serde_path_to_error` so every
//!   message names the field.
//! - [`QueryParams`]: the query string, taken parameter by parameter so each
//!   error names its parameter, and unknown parameters are refused.
//! - [`IdPath`]: a typed id from the path; a malformed id is `404`, since no
//!   such resource can exist.

use std::future::poll_fn;
use std::pin::Pin;
use std::str::FromStr;

use axum::body::{Body, HttpBody};
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use serde::de::DeserializeOwned;

use crate::AppState;
use crate::error::ApiError;
use crate::limits::{MAX_BODY_DEPTH, json_depth};

/// A JSON request body deserialized into `T`.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        check_json_content_type(req.headers())?;
        let limit = state.config().max_body_bytes;
        let bytes = read_body(req.into_body(), limit).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

pub(crate) fn check_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let unsupported = || {
        ApiError::UnsupportedMediaType(
            "the request body must be JSON (Content-Type: application/json)".into(),
        )
    };
    let value = headers.get(header::CONTENT_TYPE).ok_or_else(unsupported)?;
    let value = value.to_str().map_err(|_| unsupported())?;
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let is_json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if is_json { Ok(()) } else { Err(unsupported()) }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "the request body is larger than the limit of {limit} bytes"
    ))
}

/// Reads the whole body, refusing it as soon as it passes `limit` bytes
/// (without buffering more than that).
pub(crate) async fn read_body(mut body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large(limit));
    }
    let mut buf = Vec::new();
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame
            .map_err(|e| ApiError::BadRequest(format!("could not read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large(limit));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

/// Deserializes JSON, naming the field at fault in any error.
/// A body nested deeper than [`MAX_BODY_DEPTH`] is refused before parsing.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if json_depth(bytes) > MAX_BODY_DEPTH {
        return Err(ApiError::BadRequest(format!(
            "invalid JSON body: nests arrays and objects deeper than the limit of {MAX_BODY_DEPTH} levels"
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ApiError::BadRequest(format!("invalid JSON body: {inner}"))
        } else {
            ApiError::BadRequest(format!("invalid JSON body at `{path}`: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
    // Only an escape can put U+0000 in a JSON string, so a body without one
    // (nearly every body) costs one scan for backslashes.
    let nul_escape = bytes
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\\' && bytes[i + 1..].starts_with(b"u0000"));
    if nul_escape {
        refuse_nul(bytes)?;
    }
    Ok(value)
}

/// Refuses a body with U+0000 in any string or key, naming where.
///
/// PostgreSQL's `text` cannot hold it, and no name, key, label or URL needs
/// it, so it is refused on both backends alike (422) before anything is
/// written. An event's top-level `payload` is exempt: it is kept as the
/// producer's JSON text, where `\u0000` stays an escape.
fn refuse_nul(bytes: &[u8]) -> Result<(), ApiError> {
    fn walk(v: &serde_json::Value, path: &str) -> Option<String> {
        match v {
            serde_json::Value::String(s) if s.contains('\0') => Some(path.to_owned()),
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| walk(item, &format!("{path}[{i}]"))),
            serde_json::Value::Object(map) => map.iter().find_map(|(k, item)| {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if k.contains('\0') {
                    return Some(here);
                }
                if path.is_empty() && k == "payload" {
                    return None;
                }
                walk(item, &here)
            }),
            _ => None,
        }
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return Ok(());
    };
    match walk(&value, "") {
        None => Ok(()),
        Some(path) => Err(ApiError::invalid(
            &path,
            "contains the NUL character (U+0000), which hookd does not store",
        )),
    }
}

/// The query string of a request, consumed parameter by parameter.
#[derive(Debug)]
pub(crate) struct QueryParams {
    pairs: Vec<(String, String)>,
}

impl<S: Send + Sync> FromRequestParts<S> for QueryParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let pairs = url::form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect::<Vec<(String, String)>>();
        if let Some((k, _)) = pairs
            .iter()
            .find(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            let k: String = k.chars().filter(|c| *c != '\0').take(64).collect();
            return Err(ApiError::BadRequest(format!(
                "query parameter `{k}` contains the NUL character (U+0000)"
            )));
        }
        Ok(Self { pairs })
    }
}

impl QueryParams {
    /// Removes and returns `name`'s value. Absent or empty is `None`; given
    /// twice is an error.
    pub(crate) fn take(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        let mut found = None;
        let mut i = 0;
        while i < self.pairs.len() {
            if self.pairs[i].0 == name {
                let (_, v) = self.pairs.remove(i);
                if found.is_some() {
                    return Err(ApiError::BadRequest(format!(
                        "query parameter `{name}` is given more than once"
                    )));
                }
                found = Some(v);
            } else {
                i += 1;
            }
        }
        Ok(found.filter(|v| !v.is_empty()))
    }

    /// Removes `name` and parses it; `parse`'s message says what was wrong.
    pub(crate) fn take_parsed<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ApiError> {
        match self.take(name)? {
            None => Ok(None),
            Some(v) => parse(&v)
                .map(Some)
                .map_err(|why| ApiError::BadRequest(format!("query parameter `{name}`: {why}"))),
        }
    }

    /// Refuses any parameter that was not taken.
    pub(crate) fn finish(self) -> Result<(), ApiError> {
        match self.pairs.first() {
            None => Ok(()),
            Some((k, _)) => {
                let k: String = k.chars().take(64).collect();
                Err(ApiError::BadRequest(format!(
                    "unknown query parameter `{k}`"
                )))
            }
        }
    }
}

/// Parses a value with its `FromStr`, keeping the error's words.
pub(crate) fn from_str<T: FromStr>(s: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| e.to_string())
}

/// The page size: `default` when absent, 1 to `max` when given.
pub(crate) fn take_limit(q: &mut QueryParams, default: u32, max: u32) -> Result<u32, ApiError> {
    Ok(q.take_parsed("limit", |s| match s.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be an integer from 1 to {max}")),
    })?
    .unwrap_or(default))
}

/// A typed id taken from the path's one parameter.
#[derive(Debug)]
pub(crate) struct IdPath<T>(pub T);

impl<T, S> FromRequestParts<S> for IdPath<T>
where
    T: FromStr + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let what = parts
            .uri
            .path()
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or("resource");
        let what = match what {
            "subscriptions" => "subscription",
            "events" => "event",
            "deliveries" => "delivery",
            _ => "resource",
        };
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found(what))?;
        raw.parse()
            .map(IdPath)
            .map_err(|_| ApiError::not_found(what))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::value::RawValue;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Probe {
        #[allow(dead_code)]
        name: String,
        payload: Box<RawValue>,
    }

    fn message(e: ApiError) -> String {
        match e {
            ApiError::BadRequest(m) => m,
            other => panic!("expected a bad request, got {other:?}"),
        }
    }

    #[test]
    fn raw_payloads_survive_byte_for_byte() {
        let p: Probe = parse_json(br#"{"name":"n","payload": { "a" :1.50 ,"b":[ ]} }"#).unwrap();
        assert_eq!(p.payload.get(), r#"{ "a" :1.50 ,"b":[ ]}"#);
    }

    #[test]
    fn errors_name_the_field() {
        let m = message(parse_json::<Probe>(br#"{"payload":1}"#).unwrap_err());
        assert!(m.contains("`name`"), "{m}");
        let m = message(parse_json::<Probe>(br#"{"name":1,"payload":1}"#).unwrap_err());
        assert!(m.contains("`name`"), "{m}");
        let m = message(parse_json::<Probe>(br#"{"name":"n","payload":1,"extra":2}"#).unwrap_err());
        assert!(m.contains("`extra`"), "{m}");
        let m = message(parse_json::<Probe>(br#"{"name":"n","payload":1} x"#).unwrap_err());
        assert!(m.contains("trailing"), "{m}");
    }
}
