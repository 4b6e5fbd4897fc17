//! Loopback ports where nothing listens.

/// A loopback port where nothing listens (connections are refused), held for
/// as long as the value lives: bound but never listening, so no server another
/// test starts on port 0 meanwhile can be given it. A port merely freed once
/// was, and a call meant to be refused reached that server instead.
pub struct DeadPort {
    pub port: u16,
    _bound: tokio::net::TcpSocket,
}

/// A port nothing listens on, until the value drops.
pub fn dead_port() -> DeadPort {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .unwrap();
    DeadPort {
        port: socket.local_addr().unwrap().port(),
        _bound: socket,
    }
}

impl DeadPort {
    /// `http://127.0.0.1:{port}{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}
