//! The body that carries a request's concurrency lease: the service's own body, with the
//! lease released when the body ends, fails, or is dropped, whichever comes first. A client
//! that disconnects mid-response drops the body, and with it the lease.
//!
//! Only a leased response is wrapped. Every other response keeps the service's own body, so
//! an axum service's body passes through without being boxed again.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate::Permit;

pin_project! {
    /// A response body holding a lease until it ends (dropping the permit releases its leases;
    /// its rate units stay used).
    #[derive(Debug)]
    pub(crate) struct LeasedBody<B> {
        #[pin]
        body: B,
        permit: Option<Permit>,
    }
}

impl<B> LeasedBody<B> {
    pub(crate) fn new(body: B, permit: Permit) -> LeasedBody<B> {
        LeasedBody {
            body,
            permit: Some(permit),
        }
    }
}

impl<B> Body for LeasedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                this.permit.take();
            }
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::convert::Infallible;

    use http_body_util::BodyExt;
    use tollgate::{Limit, Limiter, Policy, Request, Reserve};

    use super::*;

    /// A body of the given frames, each ready at once.
    struct Frames(VecDeque<&'static str>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|text| Ok(Frame::data(Bytes::from(text)))),
            )
        }
    }

    fn one_lease() -> Limiter {
        let limiter = Limiter::in_memory();
        let policy = Policy::concurrency(1, 60_000_000, Reserve::default()).expect("valid");
        limiter.set_limit(Limit::new("conc", policy, None).expect("valid"));
        limiter
    }

    async fn lease(limiter: &Limiter) -> Option<Permit> {
        let outcome = limiter.try_acquire(&Request::new("conc")).await;
        outcome.expect("decides").granted()
    }

    #[tokio::test]
    async fn the_lease_is_held_until_the_body_ends() {
        let limiter = one_lease();
        let permit = lease(&limiter).await.expect("the one lease");
        let mut body = LeasedBody::new(Frames(VecDeque::from(["a", "b"])), permit);
        let first = body.frame().await.expect("a frame").expect("ok");
        assert_eq!(first.into_data().ok(), Some(Bytes::from("a")));
        assert!(
            lease(&limiter).await.is_none(),
            "held after the first frame"
        );
        body.frame().await.expect("a frame").expect("ok");
        assert!(lease(&limiter).await.is_none(), "held after the last frame");
        assert!(body.frame().await.is_none(), "the body ends");
        assert!(lease(&limiter).await.is_some(), "released at the end");
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_releases_the_lease() {
        let limiter = one_lease();
        let permit = lease(&limiter).await.expect("the one lease");
        let mut body = LeasedBody::new(Frames(VecDeque::from(["a", "b"])), permit);
        body.frame().await.expect("a frame").expect("ok");
        assert!(lease(&limiter).await.is_none(), "held mid-body");
        drop(body);
        assert!(lease(&limiter).await.is_some(), "released on drop");
    }
}
