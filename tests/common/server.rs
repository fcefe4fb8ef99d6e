//! `perpetuity serve` as a child process on a free loopback port, and plain HTTP/1.1 requests
//! to it over a fresh connection each, for the tests that start, kill and restart the binary.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started server may take to answer `/healthz`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `perpetuity serve`, killed (SIGKILL) when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    /// Spawn `perpetuity serve --listen 127.0.0.1:PORT` on a free port, stdout discarded;
    /// `configure` adds the rest (data dir, upstreams, environment, stderr). Does not wait.
    pub fn spawn(configure: impl FnOnce(&mut Command)) -> Self {
        Self::spawn_under(&[], configure)
    }

    /// [`Server::spawn`], its command line run by `wrapper` (a program and its arguments, such
    /// as `prlimit --nofile=128 --`) where one is given.
    pub fn spawn_under(wrapper: &[&str], configure: impl FnOnce(&mut Command)) -> Self {
        let port = free_port();
        let binary = env!("CARGO_BIN_EXE_perpetuity");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null());
        configure(&mut command);
        Self {
            child: command.spawn().unwrap(),
            port,
        }
    }

    /// [`Server::spawn`] on data directory `data` in front of the upstream at `upstream`, its
    /// log (`RUST_LOG=info`) appended to the file `log`, no crash point or injected error set;
    /// `configure` adds the rest. Does not wait.
    pub fn spawn_logged(
        data: &std::path::Path,
        upstream: &str,
        log: &std::path::Path,
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Self::spawn(|command| {
            command
                .args(["--data", data.to_str().unwrap()])
                .args(["--upstream", &format!("openai={upstream}")])
                .env("RUST_LOG", "info")
                .env_remove("PERPETUITY_FAILPOINT")
                .env_remove("PERPETUITY_FAILPOINT_ERRORS")
                .stderr(log);
            configure(command);
        })
    }

    /// [`Server::spawn`], then wait until `/healthz` answers; returns its answer too.
    pub fn start(configure: impl FnOnce(&mut Command)) -> (Self, Answer) {
        let mut server = Self::spawn(configure);
        let health = server.wait_ready();
        (server, health)
    }

    /// Poll `/healthz` until it answers (panics after a minute or if the process exits).
    pub fn wait_ready(&mut self) -> Answer {
        let started = Instant::now();
        loop {
            match self.request("GET", "/healthz", &[], b"") {
                Ok(answer) => return answer,
                Err(err) => {
                    assert!(self.running(), "the server exited before answering: {err}");
                    assert!(
                        started.elapsed() < READY_TIMEOUT,
                        "the server did not come up: {err}"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// Whether the process is still running (an answer on its port came from it).
    /// Send the server `signal` (`TERM`, `INT`) and wait for it to end; its exit status.
    pub fn signal(&mut self, signal: &str) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal}");
        self.child.wait().unwrap()
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// SIGKILL: no destructor runs, nothing is flushed.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// One request on its own connection; see [`request`].
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Answer> {
        request(self.port, method, path, headers, body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A complete HTTP response.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// The header lines, lowercased names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!("not JSON ({err}): {}", String::from_utf8_lossy(&self.body))
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request (`Connection: close`, a `Content-Length` body) read to the end. A
/// response counts only when it arrived whole: its full `Content-Length`, or a chunked body
/// through its last chunk; anything less (the server died mid-answer) is an error.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse(&raw).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("incomplete response ({} bytes)", raw.len()),
        )
    })
}

/// A whole response, or `None` when `raw` stops short of one.
fn parse(raw: &[u8]) -> Option<Answer> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let answer = |body| Answer {
        status,
        headers: headers.clone(),
        body,
    };
    let find = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return dechunk(rest).map(answer);
    }
    match find("content-length") {
        Some(length) => {
            let length: usize = length.parse().ok()?;
            (rest.len() == length).then(|| answer(rest.to_vec()))
        }
        None => Some(answer(rest.to_vec())),
    }
}

/// The body of a chunked transfer, or `None` without its last (empty) chunk.
fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        if rest.len() < size + 2 {
            return None;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
