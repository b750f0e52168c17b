//! HTTP/2 below gRPC, for playing the attacker: raw frames over a TCP connection
//! (what no well-behaved client library would send), and connections from other
//! loopback addresses (127.0.0.2, 127.0.0.3, …) so that one test can be several
//! clients.

use std::{net::SocketAddr, time::Duration};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;

pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;

/// SETTINGS_MAX_CONCURRENT_STREAMS.
pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;

/// One frame, as bytes.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK: literal header fields without indexing, new names, no Huffman coding.
pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        for s in [name, value] {
            assert!(s.len() < 127, "short strings only");
            out.push(s.len() as u8);
            out.extend_from_slice(s.as_bytes());
        }
    }
    out
}

/// The headers of a gRPC call to `path`.
pub fn grpc_request_headers(path: &str) -> Vec<u8> {
    header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

/// Reads frames from the server's side of a raw connection.
pub struct FrameReader<R> {
    reader: R,
    buffer: Vec<u8>,
}

/// A frame as read: (type, flags, stream id, payload).
pub type Frame = (u8, u8, u32, Vec<u8>);

impl<R: tokio::io::AsyncRead + Unpin> FrameReader<R> {
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            buffer: Vec::new(),
        }
    }

    /// The next frame, or `None` once the server closed the connection.
    pub async fn read_frame(&mut self) -> Option<Frame> {
        loop {
            if self.buffer.len() >= 9 {
                let len = (usize::from(self.buffer[0]) << 16)
                    | (usize::from(self.buffer[1]) << 8)
                    | usize::from(self.buffer[2]);
                if self.buffer.len() >= 9 + len {
                    let header: Vec<u8> = self.buffer.drain(..9).collect();
                    let payload: Vec<u8> = self.buffer.drain(..len).collect();
                    let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]])
                        & 0x7fff_ffff;
                    return Some((header[3], header[4], id, payload));
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// The next frame within `within`; panics if none comes (the server is silent).
    pub async fn next(&mut self, within: Duration) -> Option<Frame> {
        tokio::time::timeout(within, self.read_frame())
            .await
            .expect("a frame, or the end of the connection, in time")
    }
}

/// The client side of a raw HTTP/2 connection.
pub struct RawConnection {
    pub reader: FrameReader<tokio::net::tcp::OwnedReadHalf>,
    pub writer: tokio::net::tcp::OwnedWriteHalf,
}

impl RawConnection {
    /// Sends the preface and an empty SETTINGS frame.
    pub async fn open(stream: TcpStream) -> Self {
        let (reader, writer) = stream.into_split();
        let mut connection = Self {
            reader: FrameReader::new(reader),
            writer,
        };
        connection.send(PREFACE).await;
        connection.send(&frame(SETTINGS, 0, 0, &[])).await;
        connection
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).await.expect("send");
    }

    /// The next frame within `within`, or `None` once the server closed the connection.
    pub async fn next_frame_within(&mut self, within: Duration) -> Option<Frame> {
        self.reader.next(within).await
    }

    /// The server's first SETTINGS frame, as (identifier, value) pairs.
    pub async fn server_settings(&mut self) -> Vec<(u16, u32)> {
        loop {
            let (kind, flags, _, payload) = self
                .next_frame_within(Duration::from_secs(10))
                .await
                .expect("the server's SETTINGS");
            if kind == SETTINGS && flags & ACK == 0 {
                return payload
                    .chunks_exact(6)
                    .map(|c| {
                        (
                            u16::from_be_bytes([c[0], c[1]]),
                            u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                        )
                    })
                    .collect();
            }
        }
    }
}

/// The representations of the header fields in an HPACK block (RFC 7541 section
/// 6), counted by kind: what the encoder put in the connection's dynamic table, and
/// what it asked never to be indexed anywhere.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Representations {
    /// A field sent as an index into the static or dynamic table.
    pub indexed: usize,
    /// A literal added to the dynamic table.
    pub incremental: usize,
    /// A literal left out of the table this once.
    pub without_indexing: usize,
    /// A literal no encoder along the way may index.
    pub never_indexed: usize,
}

impl std::ops::AddAssign for Representations {
    fn add_assign(&mut self, other: Self) {
        self.indexed += other.indexed;
        self.incremental += other.incremental;
        self.without_indexing += other.without_indexing;
        self.never_indexed += other.never_indexed;
    }
}

/// Counts the representations in one header block; panics on a malformed block.
pub fn representations(block: &[u8]) -> Representations {
    // An integer with an N-bit prefix (section 5.1).
    fn int(block: &[u8], pos: &mut usize, prefix: u32) -> usize {
        let max = (1usize << prefix) - 1;
        let mut value = usize::from(block[*pos]) & max;
        *pos += 1;
        if value < max {
            return value;
        }
        let mut shift = 0;
        loop {
            let byte = block[*pos];
            *pos += 1;
            value += usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                return value;
            }
        }
    }
    // A literal: its name (an index, or a string when the index is 0), its value.
    fn literal(block: &[u8], pos: &mut usize, prefix: u32) {
        if int(block, pos, prefix) == 0 {
            let len = int(block, pos, 7);
            *pos += len;
        }
        let len = int(block, pos, 7);
        *pos += len;
    }
    let mut counts = Representations::default();
    let mut pos = 0;
    while pos < block.len() {
        let first = block[pos];
        if first & 0x80 != 0 {
            int(block, &mut pos, 7);
            counts.indexed += 1;
        } else if first & 0xc0 == 0x40 {
            literal(block, &mut pos, 6);
            counts.incremental += 1;
        } else if first & 0xe0 == 0x20 {
            int(block, &mut pos, 5); // a dynamic table size update
        } else if first & 0xf0 == 0x10 {
            literal(block, &mut pos, 4);
            counts.never_indexed += 1;
        } else {
            literal(block, &mut pos, 4);
            counts.without_indexing += 1;
        }
    }
    assert_eq!(pos, block.len(), "the block ends with its last field");
    counts
}

/// An encoded message as gRPC frames it in a body: uncompressed, length first.
pub fn grpc_message(encoded: &[u8]) -> Vec<u8> {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    framed.extend_from_slice(encoded);
    framed
}

/// One unary gRPC call on stream `id` of a raw connection: `message` (already
/// encoded) as one DATA frame, then every frame of the answer until its end. Returns
/// the representations of the answer's header blocks (headers and trailers), summed.
pub async fn raw_unary(
    raw: &mut RawConnection,
    id: u32,
    path: &str,
    message: &[u8],
) -> Representations {
    raw.send(&frame(
        HEADERS,
        END_HEADERS,
        id,
        &grpc_request_headers(path),
    ))
    .await;
    raw.send(&frame(DATA, END_STREAM, id, &grpc_message(message)))
        .await;
    let mut counts = Representations::default();
    loop {
        let (kind, flags, stream, payload) = raw
            .next_frame_within(Duration::from_secs(10))
            .await
            .expect("the answer, before the connection ends");
        if stream != id {
            continue;
        }
        assert_ne!(kind, RST_STREAM, "the stream was reset");
        if kind == HEADERS {
            assert!(flags & END_HEADERS != 0, "no CONTINUATION for short blocks");
            counts += representations(&payload);
        }
        if flags & END_STREAM != 0 {
            return counts;
        }
    }
}

/// Waits until the server closes `stream` (EOF or a reset); panics after `within`.
pub async fn closed_within(stream: &mut TcpStream, within: Duration) {
    let mut sink = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .expect("the server closes the connection in time");
}

/// An HTTP/2 connection (the h2 crate's client) from the loopback address `from`.
pub async fn h2_client_from(from: &str, addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let from = from.parse().expect("a loopback address");
    let tcp = crate::helpers::tcp_from(from, addr).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send.ready().await.expect("ready")
}

/// A gRPC request's headers for the h2 crate.
pub fn grpc_request(addr: SocketAddr, path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// The grpc-status of a response (trailers-only answers carry it in the headers).
pub fn grpc_status(response: &http::Response<h2::RecvStream>) -> Option<i32> {
    response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// One unary gRPC call over a plain HTTP/2 connection (the h2 crate), with `headers`
/// added to the request: unlike a tonic client, nothing here enforces a
/// `grpc-timeout` on the client's clock, so what comes back is the server's answer.
/// Returns the `grpc-status` and `grpc-message`.
pub async fn unary(
    addr: SocketAddr,
    path: &str,
    message: &impl prost::Message,
    headers: &[(&str, &str)],
) -> (i32, String) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut send = send.ready().await.expect("ready");
    let mut request = grpc_request(addr, path);
    for (name, value) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let (response, mut body) = send.send_request(request, false).expect("a stream");
    body.send_data(grpc_message(&message.encode_to_vec()).into(), true)
        .expect("send the message");
    let response = response.await.expect("a response");
    let field = |map: &http::HeaderMap, name: &str| {
        map.get(name)
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    };
    if let Some(code) = field(response.headers(), "grpc-status") {
        // Trailers-only: the status is in the headers.
        let message = field(response.headers(), "grpc-message").unwrap_or_default();
        return (code.parse().unwrap(), message);
    }
    let mut received = response.into_body();
    while let Some(chunk) = received.data().await {
        chunk.expect("the response body");
    }
    let trailers = received
        .trailers()
        .await
        .expect("trailers")
        .expect("a status");
    let code = field(&trailers, "grpc-status").expect("grpc-status");
    let message = field(&trailers, "grpc-message").unwrap_or_default();
    (code.parse().unwrap(), message)
}
