//! `authd admin events tail`: WatchEvents, each event printed (and flushed) as it
//! arrives: a line of text, or a JSON object a line with `--json`.

use super::{Admin, Failure, failure};
use crate::pb::admin::{AccountEvent, WatchEventsRequest, watch_events_request::Start};
use std::io::Write as _;
use tonic::Request;

/// One event as printed.
fn line(event: &AccountEvent, as_json: bool) -> String {
    let time = super::view::rfc3339(event.time.as_ref()).unwrap_or_default();
    if as_json {
        let data: serde_json::Value =
            serde_json::from_str(&event.data_json).unwrap_or(serde_json::Value::Null);
        let object = serde_json::json!({
            "position": event.position,
            "time": time,
            "user_id": event.user_id,
            "type": event.r#type,
            "data": data,
        });
        format!("{object}\n")
    } else {
        format!(
            "{}\t{time}\t{}\t{}\t{}\n",
            event.position, event.r#type, event.user_id, event.data_json
        )
    }
}

/// Prints the events of the stream until it ends, `count` were printed, or the
/// process is interrupted. The stream has no timeout (the connection's applies).
pub(super) async fn tail(
    admin: &Admin,
    from: Option<u64>,
    oldest: bool,
    count: Option<u64>,
    as_json: bool,
) -> Result<String, Failure> {
    let (start, after_position) = match (from, oldest) {
        (_, true) => (Start::Oldest, 0),
        (Some(after), false) => (Start::AfterPosition, after),
        (None, false) => (Start::Now, 0),
    };
    let mut request = Request::new(WatchEventsRequest {
        start: start as i32,
        after_position,
    });
    (request.metadata_mut()).insert("authorization", admin.authorization.clone());
    let opened = tokio::time::timeout(admin.timeout, admin.client().watch_events(request))
        .await
        .map_err(|_| Admin::timeout(&admin.addr, admin.timeout))?
        .map_err(|status| failure(&admin.addr, admin.timeout, status))?;
    let mut stream = opened.into_inner();
    let mut printed = 0;
    while count.is_none_or(|n| printed < n) {
        let event = match stream.message().await {
            Ok(Some(event)) => event,
            Ok(None) => break,
            Err(status) => return Err(failure(&admin.addr, admin.timeout, status)),
        };
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(line(&event, as_json).as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(Failure::Output)?;
        printed += 1;
    }
    Ok(String::new())
}
