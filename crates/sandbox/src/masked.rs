//! Responses from a destination the egress proxy adds a credential for, with the
//! credential masked wherever it shows: an upstream that echoes requests (a debug
//! endpoint, an error page quoting the `Authorization` header) would otherwise hand
//! the sandbox the very secret it must never hold.
//!
//! Each occurrence is overwritten byte for byte with `*`, so a response keeps its
//! length (and its `Content-Length`). The body streams: bytes are held back only as
//! long as a credential could still begin in them.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, SizeHint};
use hyper::header::{HeaderMap, HeaderValue};

/// The credentials to mask in one response.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Arc<[Vec<u8>]>);

impl Secrets {
    pub(crate) fn new(secrets: impl IntoIterator<Item = Vec<u8>>) -> Self {
        Secrets(secrets.into_iter().filter(|s| !s.is_empty()).collect())
    }

    fn longest(&self) -> usize {
        self.0.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Overwrites every occurrence of a secret in `bytes` with `*`.
    fn mask(&self, bytes: &mut [u8]) -> bool {
        let mut masked = false;
        for secret in self.0.iter() {
            let mut at = 0;
            while at + secret.len() <= bytes.len() {
                if bytes[at..at + secret.len()] == secret[..] {
                    bytes[at..at + secret.len()].fill(b'*');
                    masked = true;
                    at += secret.len();
                } else {
                    at += 1;
                }
            }
        }
        masked
    }

    /// Masks the secrets in every header value that holds one.
    pub(crate) fn mask_headers(&self, headers: &mut HeaderMap) {
        for value in headers.values_mut() {
            let mut bytes = value.as_bytes().to_vec();
            if self.mask(&mut bytes) {
                if let Ok(masked) = HeaderValue::from_bytes(&bytes) {
                    *value = masked;
                }
            }
        }
    }

    /// `body` with the secrets masked as it streams.
    pub(crate) fn mask_body<B>(&self, body: B) -> Masked<B> {
        Masked {
            inner: body,
            secrets: self.clone(),
            held: Vec::new(),
            after: None,
            ended: false,
        }
    }
}

/// A response body with [`Secrets`] masked.
pub(crate) struct Masked<B> {
    inner: B,
    secrets: Secrets,
    /// Bytes read but not yet passed on: a secret may begin in them.
    held: Vec<u8>,
    /// A trailers frame that came while bytes were held; it goes after them.
    after: Option<Frame<Bytes>>,
    ended: bool,
}

impl<B> Masked<B> {
    /// The held bytes that can go now (all of them at the end of the body).
    fn release(&mut self, all: bool) -> Option<Frame<Bytes>> {
        self.secrets.mask(&mut self.held);
        let keep = match all {
            true => 0,
            false => self
                .secrets
                .longest()
                .saturating_sub(1)
                .min(self.held.len()),
        };
        let ready: Vec<u8> = self.held.drain(..self.held.len() - keep).collect();
        (!ready.is_empty()).then(|| Frame::data(Bytes::from(ready)))
    }
}

impl<B> Body for Masked<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(frame) = this.after.take() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if this.ended {
                return Poll::Ready(this.release(true).map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.held.extend_from_slice(&data);
                        if let Some(ready) = this.release(false) {
                            return Poll::Ready(Some(Ok(ready)));
                        }
                    }
                    Err(trailers) => {
                        this.after = Some(trailers);
                        if let Some(ready) = this.release(true) {
                            return Poll::Ready(Some(Ok(ready)));
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.held.is_empty() && self.after.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let held = self.held.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn through(secrets: &Secrets, chunks: &[&str]) -> String {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from(c.to_string()))))
            .collect();
        let body = frames_of(frames);
        let out = secrets.mask_body(body).collect().await.unwrap().to_bytes();
        String::from_utf8(out.to_vec()).unwrap()
    }

    fn frames_of(
        items: Vec<Result<Frame<Bytes>, std::convert::Infallible>>,
    ) -> impl Body<Data = Bytes, Error = std::convert::Infallible> + Unpin {
        type Item = Result<Frame<Bytes>, std::convert::Infallible>;
        struct Iter(std::vec::IntoIter<Item>);
        impl Body for Iter {
            type Data = Bytes;
            type Error = std::convert::Infallible;
            fn poll_frame(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
                Poll::Ready(self.get_mut().0.next())
            }
        }
        Iter(items.into_iter())
    }

    #[tokio::test]
    async fn a_secret_is_masked_even_split_across_chunks() {
        let secrets = Secrets::new([b"s3cret-token".to_vec()]);
        let whole = "authorization: Bearer s3cret-token\n";
        assert_eq!(
            through(&secrets, &[whole]).await,
            "authorization: Bearer ************\n"
        );
        for split in 1..whole.len() {
            let (a, b) = whole.split_at(split);
            let out = through(&secrets, &[a, b]).await;
            assert_eq!(out.len(), whole.len());
            assert!(!out.contains("s3cret"), "split at {split}: {out}");
        }
        let bytewise: Vec<String> = "xs3cret-tokens3cret-tokenx"
            .chars()
            .map(String::from)
            .collect();
        let refs: Vec<&str> = bytewise.iter().map(String::as_str).collect();
        assert_eq!(through(&secrets, &refs).await, "x************************x");
        assert_eq!(
            through(&secrets, &["no secret here"]).await,
            "no secret here"
        );
    }

    #[test]
    fn headers_holding_a_secret_are_masked() {
        let secrets = Secrets::new([b"s3cret".to_vec(), Vec::new()]);
        let mut headers = HeaderMap::new();
        headers.insert("x-echo", HeaderValue::from_static("token=s3cret;"));
        headers.insert("x-other", HeaderValue::from_static("fine"));
        secrets.mask_headers(&mut headers);
        assert_eq!(headers["x-echo"], "token=******;");
        assert_eq!(headers["x-other"], "fine");
    }
}
