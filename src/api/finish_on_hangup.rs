//! A request that may change something runs to its end once it has reached
//! its handler, whether or not its client waits for the answer.
//!
//! hyper drops a request's future when its client hangs up, and the time
//! limit drops it when it runs out. A change dropped half-way could leave the
//! store written and the live model sessions never told (`catalog_changed`
//! lost), or a registration made in one role and not the next. So every
//! request but the safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`) runs inside
//! [`FinishOnDrop`]: inline while it is awaited, in a tracked task once it is
//! dropped, and shutdown waits for those tasks.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use futures::future::Either;
use tower::{Layer, Service};

use crate::runtime::{FinishOnDrop, ToolRuntime};

/// Wraps a service so that its unsafe-method requests finish once started.
#[derive(Clone)]
pub struct FinishOnHangupLayer {
    runtime: ToolRuntime,
}

impl FinishOnHangupLayer {
    pub fn new(runtime: ToolRuntime) -> Self {
        Self { runtime }
    }
}

impl<S> Layer<S> for FinishOnHangupLayer {
    type Service = FinishOnHangup<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FinishOnHangup {
            inner,
            runtime: self.runtime.clone(),
        }
    }
}

/// The service of [`FinishOnHangupLayer`].
#[derive(Clone)]
pub struct FinishOnHangup<S> {
    inner: S,
    runtime: ToolRuntime,
}

impl<S> Service<Request> for FinishOnHangup<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<S::Future, FinishOnDrop<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // A safe method changes nothing, so it costs nothing more.
        if request.method().is_safe() {
            return Either::Left(self.inner.call(request));
        }
        let handled = self.inner.call(request);
        Either::Right(self.runtime.finish_on_drop("request", handled))
    }
}
