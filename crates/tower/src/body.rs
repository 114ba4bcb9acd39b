//! The response body: the service's own body carrying the request's concurrency lease, or the
//! layer's own short answer (a 429, a 503). The lease is released when the body ends, fails,
//! or is dropped, whichever comes first: a client that disconnects mid-response drops the
//! body, and with it the lease.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate::Permit;

pin_project! {
    /// The body of a response that went through the throttle.
    #[derive(Debug)]
    pub struct ThrottleBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            // Dropping a permit releases its leases (its rate units stay used). Boxed: only a
            // lease is held, and a body that holds none stays small to move.
            permit: Option<Box<Permit>>,
        },
        Answer {
            data: Option<Bytes>,
        },
    }
}

impl<B> ThrottleBody<B> {
    pub(crate) fn inner(body: B, permit: Option<Box<Permit>>) -> ThrottleBody<B> {
        ThrottleBody {
            kind: Kind::Inner { body, permit },
        }
    }

    pub(crate) fn answer(data: Bytes) -> ThrottleBody<B> {
        ThrottleBody {
            kind: Kind::Answer { data: Some(data) },
        }
    }

    /// Whether this body still holds a lease.
    pub fn holds_lease(&self) -> bool {
        matches!(
            &self.kind,
            Kind::Inner {
                permit: Some(_),
                ..
            }
        )
    }
}

impl<B> Body for ThrottleBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, permit } => {
                let polled = body.poll_frame(cx);
                match &polled {
                    Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                        permit.take();
                    }
                    Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
                }
                polled
            }
            KindProj::Answer { data } => Poll::Ready(data.take().map(|data| Ok(Frame::data(data)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Answer { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Answer { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
