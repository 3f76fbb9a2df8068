//! One Kafka connection for tests that speak the protocol frame by frame.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One Kafka connection that sends a request and reads its answer.
pub struct Conn {
    s: TcpStream,
    corr: i32,
}

impl Conn {
    pub async fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        Conn { s, corr: 0 }
    }

    pub async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Resp {
        self.call_or_closed(key, version, req)
            .await
            .unwrap_or_else(|| panic!("{key:?}: the connection closed"))
    }

    /// [`Conn::call`], or `None` when the server closed the connection (or died).
    pub async fn call_or_closed<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Option<Resp> {
        self.corr += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.corr)
            .with_client_id(Some(StrBytes::from_static_str("it")));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        req.encode(&mut buf, version).unwrap();
        self.s
            .write_all(&(buf.len() as i32).to_be_bytes())
            .await
            .ok()?;
        self.s.write_all(&buf).await.ok()?;
        let mut len = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(20), self.s.read_exact(&mut len))
            .await
            .unwrap_or_else(|_| panic!("{key:?}: no answer within 20 s"))
            .ok()?;
        let mut body = vec![0; i32::from_be_bytes(len) as usize];
        self.s.read_exact(&mut body).await.ok()?;
        let mut body = Bytes::from(body);
        let head = ResponseHeader::decode(&mut body, key.response_header_version(version)).unwrap();
        assert_eq!(head.correlation_id, self.corr, "{key:?}");
        Some(Resp::decode(&mut body, version).unwrap())
    }
}
