//! WatchEvents: the account events as a server stream (`crate::events`), admitted
//! once for the stream (a `read` key), then fed by the stream's own task.

use super::{AdminApi, Needs, label, timestamp};
use crate::{
    error::{Error, FieldViolation},
    events::Start,
    pb::admin::{AccountEvent, WatchEventsRequest, watch_events_request},
    store::Event,
};
use std::pin::Pin;
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status};

const RPC: &str = "WatchEvents";

/// The events of WatchEvents, as tonic sends them.
pub type EventStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<AccountEvent, Status>> + Send>>;

fn event(e: Event) -> AccountEvent {
    AccountEvent {
        position: u64::try_from(e.position).unwrap_or(0),
        time: Some(timestamp(e.at)),
        user_id: e.user_id,
        r#type: e.kind,
        data_json: e.data,
    }
}

impl AdminApi {
    pub(super) async fn watch(
        &self,
        request: Request<WatchEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let caller = self.caller(&request);
        let opened = async {
            let actor = self.admit(&request, Needs::Read)?;
            let req = request.into_inner();
            let start = match watch_events_request::Start::try_from(req.start) {
                Ok(watch_events_request::Start::AfterPosition) => {
                    let after = i64::try_from(req.after_position).map_err(|_| {
                        Error::InvalidArgument(vec![FieldViolation {
                            field: "after_position",
                            description: "out of range".into(),
                        }])
                    })?;
                    Start::After(after)
                }
                Ok(watch_events_request::Start::Oldest) => Start::Oldest,
                Ok(watch_events_request::Start::Now) => Start::Now,
                Err(_) => {
                    return Err(Error::InvalidArgument(vec![FieldViolation {
                        field: "start",
                        description: "unknown start".into(),
                    }]));
                }
            };
            let Some(events) = &self.events else {
                return Err(Error::Unavailable(
                    "account events are not served here".into(),
                ));
            };
            let receiver = events.watch(start, self.stop.clone()).await?;
            Ok((actor, receiver))
        };
        match opened.await {
            Ok((actor, receiver)) => {
                (self.audit).admin(&caller, Some(&actor.name), RPC, None, "ok");
                self.metrics.request(RPC, tonic::Code::Ok);
                let stream = tokio_stream::wrappers::ReceiverStream::new(receiver)
                    .map(|item| item.map(event).map_err(|e| e.to_status()));
                Ok(Response::new(Box::pin(stream)))
            }
            Err(e) => {
                (self.audit).admin(&caller, None, RPC, None, label(&e));
                let status = e.to_status();
                self.metrics.request(RPC, status.code());
                Err(status)
            }
        }
    }
}
