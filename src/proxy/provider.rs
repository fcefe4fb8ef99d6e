//! Which provider's API a request speaks, its credential, and errors in its own shape.

use hyper::HeaderMap;
use hyper::StatusCode;
use hyper::header::HeaderValue;
use serde_json::{Value, json};

/// A provider API the proxy speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`), and OpenAI's other routes.
    OpenAi,
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
    /// Google Gemini (`/v1/models/{model}:generateContent`, and the same under `/v1beta/` and
    /// `/v1alpha/`).
    Gemini,
}

/// What kind of error the proxy itself answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The request is malformed (400).
    InvalidRequest,
    /// The credential is missing (401).
    Authentication,
    /// The credential may not do this (403).
    Forbidden,
    /// The body is over the size limit (413).
    TooLarge,
    /// The upstream could not be reached or failed (502).
    Upstream,
    /// The upstream did not answer in time (504).
    Timeout,
    /// The proxy is at its concurrency limit (503).
    Overloaded,
}

impl Failure {
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidRequest => StatusCode::BAD_REQUEST,
            Self::Authentication => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Upstream => StatusCode::BAD_GATEWAY,
            Self::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl Provider {
    /// The name used in `--upstream NAME=URL` and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Gemini => "gemini",
        }
    }

    /// The provider named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::OpenAi, Self::Anthropic, Self::Gemini]
            .into_iter()
            .find(|p| p.name() == name)
    }

    /// The provider a request is for, read from its credential headers: `x-goog-api-key` is
    /// Gemini; `x-api-key` or an `anthropic-version` is Anthropic; a Bearer token is OpenAI.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        if headers.contains_key("x-goog-api-key") {
            Some(Self::Gemini)
        } else if headers.contains_key("x-api-key") || headers.contains_key("anthropic-version") {
            Some(Self::Anthropic)
        } else if headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(bearer)
            .is_some()
        {
            Some(Self::OpenAi)
        } else {
            None
        }
    }

    /// The caller's credential as this provider carries it (`query` is the request's query
    /// string: Gemini's `?key=`): `Ok(None)` when absent. A request that carries two different
    /// credentials (`x-api-key` and a Bearer token for Anthropic, `x-goog-api-key` and `?key=`
    /// for Gemini, or one header twice) is refused with the places that disagree, never their
    /// values: the memory must belong to the key the provider checks, and which one that is
    /// is the provider's choice, not the proxy's to guess.
    pub fn credential(
        self,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<Option<String>, String> {
        let header = |name: &'static str| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(move |v| (name, v.to_owned()))
        };
        let bearers = || {
            headers
                .get_all(hyper::header::AUTHORIZATION)
                .iter()
                .filter_map(bearer)
                .map(|token| ("Authorization: Bearer", token))
        };
        let authorizations = || headers.get_all(hyper::header::AUTHORIZATION).iter();
        if !matches!(self, Self::Gemini)
            && authorizations().any(|v| bearer(v).is_some())
            && authorizations().any(|v| bearer(v).is_none())
        {
            return Err("the request carries an Authorization header that is not a Bearer token beside one that is: send one".into());
        }
        let carried: Vec<(&str, String)> = match self {
            Self::OpenAi => bearers().collect(),
            Self::Anthropic => header("x-api-key").chain(bearers()).collect(),
            Self::Gemini => header("x-goog-api-key")
                .chain(
                    query
                        .into_iter()
                        .flat_map(|q| q.split('&'))
                        .filter_map(|pair| pair.strip_prefix("key="))
                        .filter(|key| !key.is_empty())
                        .map(|key| ("?key=", key.to_owned())),
                )
                .collect(),
        };
        let Some((first_place, first)) = carried.first() else {
            return Ok(None);
        };
        match carried.iter().find(|(_, credential)| credential != first) {
            Some((place, _)) => Err(format!(
                "the request carries two different credentials ({first_place} and {place}): send one, since the memory belongs to the key the provider checks"
            )),
            None => Ok(Some(first.clone())),
        }
    }

    /// An error body in this provider's own shape, which its SDK turns into its own exception.
    pub fn error_body(self, failure: Failure, message: &str) -> Value {
        match self {
            Self::OpenAi => json!({
                "error": {
                    "message": message,
                    "type": match failure {
                        Failure::InvalidRequest | Failure::TooLarge => "invalid_request_error",
                        Failure::Authentication => "authentication_error",
                        Failure::Forbidden => "permission_error",
                        Failure::Upstream | Failure::Timeout | Failure::Overloaded => "api_error",
                    },
                    "param": null,
                    "code": null,
                }
            }),
            Self::Anthropic => json!({
                "type": "error",
                "error": {
                    "type": match failure {
                        Failure::InvalidRequest => "invalid_request_error",
                        Failure::Authentication => "authentication_error",
                        Failure::Forbidden => "permission_error",
                        Failure::TooLarge => "request_too_large",
                        Failure::Upstream | Failure::Timeout => "api_error",
                        Failure::Overloaded => "overloaded_error",
                    },
                    "message": message,
                }
            }),
            Self::Gemini => json!({
                "error": {
                    "code": failure.status().as_u16(),
                    "message": message,
                    "status": match failure {
                        Failure::InvalidRequest | Failure::TooLarge => "INVALID_ARGUMENT",
                        Failure::Authentication => "UNAUTHENTICATED",
                        Failure::Forbidden => "PERMISSION_DENIED",
                        Failure::Upstream | Failure::Overloaded => "UNAVAILABLE",
                        Failure::Timeout => "DEADLINE_EXCEEDED",
                    },
                }
            }),
        }
    }
}

/// The token of an `Authorization: Bearer` header's value.
fn bearer(value: &HeaderValue) -> Option<String> {
    let value = value.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty())
        .then(|| token.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn the_credential_type_names_the_provider() {
        let openai = headers(&[("authorization", "Bearer sk-1")]);
        assert_eq!(Provider::from_headers(&openai), Some(Provider::OpenAi));
        assert_eq!(
            Provider::OpenAi.credential(&openai, None),
            Ok(Some("sk-1".to_owned()))
        );
        let old_sdk = headers(&[("x-api-key", "ak-1"), ("anthropic-version", "2023-06-01")]);
        assert_eq!(Provider::from_headers(&old_sdk), Some(Provider::Anthropic));
        assert_eq!(
            Provider::Anthropic.credential(&old_sdk, None),
            Ok(Some("ak-1".to_owned()))
        );
        let new_sdk = headers(&[
            ("authorization", "Bearer ak-2"),
            ("anthropic-version", "2026-10-21"),
        ]);
        assert_eq!(Provider::from_headers(&new_sdk), Some(Provider::Anthropic));
        assert_eq!(
            Provider::Anthropic.credential(&new_sdk, None),
            Ok(Some("ak-2".to_owned()))
        );
        let gemini = headers(&[("x-goog-api-key", "g-1")]);
        assert_eq!(Provider::from_headers(&gemini), Some(Provider::Gemini));
        assert_eq!(
            Provider::from_headers(&headers(&[("authorization", "Basic x")])),
            None
        );
        assert_eq!(
            Provider::from_headers(&headers(&[("authorization", "Bearer  ")])),
            None
        );
    }

    #[test]
    fn two_different_credentials_are_refused_and_the_same_one_twice_is_not() {
        let both = headers(&[("x-api-key", "ak-1"), ("authorization", "Bearer ak-1")]);
        assert_eq!(
            Provider::Anthropic.credential(&both, None),
            Ok(Some("ak-1".to_owned()))
        );
        let split = headers(&[("x-api-key", "ak-1"), ("authorization", "Bearer ak-2")]);
        let refused = Provider::Anthropic.credential(&split, None).unwrap_err();
        assert!(
            refused.contains("x-api-key and Authorization: Bearer"),
            "{refused}"
        );
        assert!(!refused.contains("ak-"), "{refused}");
        let mut twice = headers(&[("x-api-key", "ak-1")]);
        twice.append("x-api-key", HeaderValue::from_static("ak-2"));
        assert!(Provider::Anthropic.credential(&twice, None).is_err());
        let google = headers(&[("x-goog-api-key", "g-1")]);
        assert_eq!(
            Provider::Gemini.credential(&google, Some("alt=sse&key=g-1")),
            Ok(Some("g-1".to_owned()))
        );
        assert!(
            Provider::Gemini
                .credential(&google, Some("key=g-2&alt=sse"))
                .is_err()
        );
        assert_eq!(
            Provider::Gemini.credential(&HeaderMap::new(), Some("alt=sse&key=g-2")),
            Ok(Some("g-2".to_owned()))
        );
        assert_eq!(
            Provider::Gemini.credential(&HeaderMap::new(), Some("key=")),
            Ok(None)
        );
        // OpenAI checks the Bearer token only; an `x-api-key` beside it names nothing.
        assert_eq!(
            Provider::OpenAi.credential(&split, None),
            Ok(Some("ak-2".to_owned()))
        );
        // A balancer reading the last Authorization header would see another key than the
        // node: a non-Bearer one beside a Bearer is refused.
        let mut beside = headers(&[("authorization", "Bearer sk-1")]);
        beside.append("authorization", HeaderValue::from_static("Basic anVuaw=="));
        for provider in [Provider::OpenAi, Provider::Anthropic] {
            let refused = provider.credential(&beside, None).unwrap_err();
            assert!(refused.contains("not a Bearer token"), "{refused}");
        }
    }

    #[test]
    fn errors_take_each_providers_shape() {
        let openai = Provider::OpenAi.error_body(Failure::Authentication, "no key");
        assert_eq!(openai["error"]["type"], "authentication_error");
        assert_eq!(openai["error"]["message"], "no key");
        let anthropic = Provider::Anthropic.error_body(Failure::TooLarge, "big");
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "request_too_large");
        let gemini = Provider::Gemini.error_body(Failure::InvalidRequest, "bad");
        assert_eq!(gemini["error"]["code"], 400);
        assert_eq!(gemini["error"]["status"], "INVALID_ARGUMENT");
    }
}
