//! The least of a Redis client the consumer benchmark needs: commands written in
//! RESP, replies parsed into [`Value`]. One connection, one command at a time.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(Debug, Clone)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Value>>),
}

impl Value {
    pub fn items(&self) -> &[Value] {
        match self {
            Value::Array(Some(v)) => v,
            _ => &[],
        }
    }
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }
}

pub struct Redis {
    stream: BufReader<TcpStream>,
}

impl Redis {
    pub async fn connect(addr: &str) -> std::io::Result<Redis> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Ok(Redis {
            stream: BufReader::new(tcp),
        })
    }

    /// Sends one command and reads its reply; a Redis error is an `Err`.
    pub async fn call(&mut self, args: &[&[u8]]) -> std::io::Result<Value> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.stream.get_mut().write_all(&out).await?;
        match Box::pin(self.read()).await? {
            Value::Error(e) => Err(std::io::Error::other(e)),
            v => Ok(v),
        }
    }

    async fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        if line.is_empty() {
            return Err(std::io::Error::other("redis closed the connection"));
        }
        Ok(line.trim_end_matches("\r\n").to_string())
    }

    async fn read(&mut self) -> std::io::Result<Value> {
        let line = self.line().await?;
        let (kind, rest) = line.split_at(1);
        let num = || {
            rest.parse::<i64>()
                .map_err(|_| std::io::Error::other(format!("bad RESP line {line:?}")))
        };
        Ok(match kind {
            "+" => Value::Simple(rest.to_string()),
            "-" => Value::Error(rest.to_string()),
            ":" => Value::Int(num()?),
            "$" => {
                let n = num()?;
                if n < 0 {
                    Value::Bulk(None)
                } else {
                    let mut buf = vec![0u8; n as usize + 2];
                    self.stream.read_exact(&mut buf).await?;
                    buf.truncate(n as usize);
                    Value::Bulk(Some(buf))
                }
            }
            "*" => {
                let n = num()?;
                if n < 0 {
                    Value::Array(None)
                } else {
                    let mut items = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        items.push(Box::pin(self.read()).await?);
                    }
                    Value::Array(Some(items))
                }
            }
            _ => return Err(std::io::Error::other(format!("bad RESP line {line:?}"))),
        })
    }
}
