//! A whole answer's body that finishes its request's bookkeeping once it is let go of.
//!
//! The connection drops an answer's body after writing its last byte (HTTP/1) or handing its last
//! frame over (HTTP/2). Work that the answer's bytes do not depend on — the request-log row, the
//! metrics, the access line, the trace's usage, the rate limits' settlement, freeing the parsed
//! request — runs then, instead of between the upstream's answer and the client's: at one client
//! that work was part of every request's wait. It still runs on the connection's task before it
//! reads the client's next request, and it runs whether or not the answer could be written.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// `data` as one frame, then `after` when dropped.
pub(super) struct AnsweredBody<After: FnOnce()> {
    data: Option<Bytes>,
    after: Option<After>,
}

impl<After: FnOnce()> AnsweredBody<After> {
    pub(super) fn new(data: Bytes, after: After) -> Self {
        AnsweredBody {
            data: (!data.is_empty()).then_some(data),
            after: Some(after),
        }
    }
}

impl<After: FnOnce() + Unpin> http_body::Body for AnsweredBody<After> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

impl<After: FnOnce()> Drop for AnsweredBody<After> {
    fn drop(&mut self) {
        if let Some(after) = self.after.take() {
            after();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn the_data_is_one_frame_of_its_exact_length_and_the_work_runs_when_dropped() {
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = ran.clone();
        let body = AnsweredBody::new(Bytes::from_static(b"{\"ok\":true}"), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(11));
        let mut body = Box::pin(body);
        let frame = body.frame().await.expect("a frame").expect("no error");
        assert_eq!(
            frame.into_data().expect("data"),
            Bytes::from_static(b"{\"ok\":true}")
        );
        assert!(http_body::Body::is_end_stream(&*body));
        assert!(body.frame().await.is_none());
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "nothing runs before the body is let go of"
        );
        drop(body);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_work_runs_once_even_when_the_answer_is_never_read() {
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = ran.clone();
        drop(AnsweredBody::new(
            Bytes::from_static(b"unread"),
            move || {
                counter.fetch_add(1, Ordering::SeqCst);
            },
        ));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
