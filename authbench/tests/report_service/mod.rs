//! The real report's service (`bench/report-service/app.py`) under uvicorn, on
//! 127.0.0.1 with a port of the system's choice, a SQLite file of its own and cheap
//! hashes; stopped when dropped.
//!
//! It needs a Python with fastapi and uvicorn: `AUTHBENCH_TEST_PYTHON` names one
//! (e.g. the suite's virtualenv), else `python3`. Without them the tests that use it
//! print one line and pass, unless `AUTHBENCH_TEST_REQUIRE_REPORT_SERVICE=1`, when
//! they fail.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

pub struct ReportService {
    pub addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

fn python() -> String {
    std::env::var("AUTHBENCH_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn required() -> bool {
    std::env::var("AUTHBENCH_TEST_REQUIRE_REPORT_SERVICE").is_ok_and(|v| v == "1")
}

/// Starts the service, or says why it cannot and returns None (panics instead when
/// it is required).
pub fn start(test: &str) -> Option<ReportService> {
    let python = python();
    let importable = Command::new(&python)
        .args(["-c", "import fastapi, uvicorn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        let why = format!(
            "{python} cannot import fastapi and uvicorn (set AUTHBENCH_TEST_PYTHON to a Python \
             that has bench/report-service/requirements.txt)"
        );
        assert!(!required(), "{test}: {why}");
        println!("skipped {test}: {why}");
        return None;
    }
    let app_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/report-service");
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(&python)
        .args(["-m", "uvicorn", "app:app", "--app-dir"])
        .arg(&app_dir)
        .args(["--host", "127.0.0.1", "--port", "0", "--log-level", "info"])
        .arg("--no-access-log")
        .env("REPORT_SERVICE_DATABASE", dir.path().join("report.db"))
        .env("REPORT_SERVICE_ITERATIONS", "1000")
        .env("REPORT_SERVICE_TOKEN_KEY", "test-key")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    // uvicorn says where it listens on stderr; the rest of its log is drained (and
    // kept for a failure's message) by a thread of its own.
    let stderr = child.stderr.take().unwrap();
    let (found, port) = mpsc::channel();
    std::thread::spawn(move || {
        let mut found = Some(found);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("Uvicorn running on http://127.0.0.1:").nth(1) {
                let port: u16 = rest.split_whitespace().next().unwrap().parse().unwrap();
                if let Some(found) = found.take() {
                    let _ = found.send(Ok(port));
                }
            } else if let Some(found) = &found {
                let _ = found.send(Err(line));
            }
        }
    });
    let mut log = Vec::new();
    let port = loop {
        match port.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(port)) => break port,
            Ok(Err(line)) => log.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("uvicorn did not start: {}", log.join("\n"));
            }
        }
    };
    Some(ReportService {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        child,
        _dir: dir,
    })
}

impl ReportService {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One request on a connection of its own; the answer's status code.
    pub fn status_of(&self, method: &str, path: &str, body: &str) -> u16 {
        let mut stream = TcpStream::connect(self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
    }
}

impl Drop for ReportService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
