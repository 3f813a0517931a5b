//! The provider binary as an attacker on the same machine meets it: started without
//! Terraform's cookie it refuses to run; once running, only a client presenting the
//! certificate Terraform gave it (`PLUGIN_CLIENT_CERT`) is served, and its unix socket
//! cannot even be opened by another user.
//!
//! The "Terraform" here is this test: it plays go-plugin's client with its own
//! certificate (P-256; Terraform's own P-521 one is exercised by every other e2e test).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use gpufleet_e2e::binaries;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

const COOKIE_KEY: &str = "TF_PLUGIN_MAGIC_COOKIE";
const COOKIE: &str = "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2";

/// A client certificate and its key, as go-plugin's client makes one per plugin start.
struct ClientCert {
    cert_pem: String,
    key_pem: String,
}

fn client_cert() -> ClientCert {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("self-signed");
    ClientCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// The provider binary with a clean plugin environment and `env` added.
fn provider_command(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(binaries::provider());
    for var in [
        COOKIE_KEY,
        "PLUGIN_PROTOCOL_VERSIONS",
        "PLUGIN_CLIENT_CERT",
        "PLUGIN_UNIX_SOCKET_DIR",
        "PLUGIN_UNIX_SOCKET_GROUP",
        "TF_DISABLE_PLUGIN_TLS",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    command
}

/// Runs the provider to its end (it must end at once) and returns (exit code, stdout, stderr).
fn run_to_refusal(env: &[(&str, &str)]) -> (i32, String, String) {
    let output = provider_command(env)
        .stdin(Stdio::null())
        .output()
        .expect("run the provider");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// What a refusal case is: its name, the environment, what stderr must say.
type RefusalCase<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);

#[test]
fn without_the_cookie_or_protocol_6_or_a_client_certificate_the_provider_refuses_to_run() {
    let cert = client_cert();
    let cases: [RefusalCase; 4] = [
        (
            "no cookie",
            vec![("PLUGIN_CLIENT_CERT", cert.cert_pem.as_str())],
            "not meant to be run directly",
        ),
        (
            "a wrong cookie",
            vec![
                (COOKIE_KEY, "0000"),
                ("PLUGIN_CLIENT_CERT", cert.cert_pem.as_str()),
            ],
            "not meant to be run directly",
        ),
        (
            "a client speaking protocol 5 only",
            vec![
                (COOKIE_KEY, COOKIE),
                ("PLUGIN_PROTOCOL_VERSIONS", "5"),
                ("PLUGIN_CLIENT_CERT", cert.cert_pem.as_str()),
            ],
            "speaks version 6",
        ),
        (
            "TLS disabled (no client certificate)",
            vec![
                (COOKIE_KEY, COOKIE),
                ("PLUGIN_PROTOCOL_VERSIONS", "6"),
                ("TF_DISABLE_PLUGIN_TLS", "1"),
            ],
            "mutual TLS",
        ),
    ];
    for (what, env, says) in cases {
        let (code, stdout, stderr) = run_to_refusal(&env);
        assert_ne!(code, 0, "{what}: the provider ran\n{stdout}\n{stderr}");
        assert!(
            stdout.trim().is_empty(),
            "{what}: a handshake line went out: {stdout}"
        );
        assert!(
            stderr.contains(says),
            "{what}: stderr lacks {says:?}: {stderr}"
        );
    }
}

/// A provider started as Terraform starts it, and what its handshake line said.
struct Running {
    child: Child,
    socket: PathBuf,
    server_cert_pem: String,
    _socket_dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(client: &ClientCert) -> Running {
    let socket_dir = tempfile::tempdir().expect("socket dir");
    let mut child = provider_command(&[
        (COOKIE_KEY, COOKIE),
        ("PLUGIN_PROTOCOL_VERSIONS", "5,6"),
        ("PLUGIN_CLIENT_CERT", client.cert_pem.as_str()),
        (
            "PLUGIN_UNIX_SOCKET_DIR",
            socket_dir.path().to_str().expect("utf-8 temp dir"),
        ),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("start the provider");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the handshake line");
    let fields: Vec<&str> = line.trim_end().split('|').collect();
    assert_eq!(fields.len(), 6, "handshake line: {line:?}");
    assert_eq!(&fields[..3], ["1", "6", "unix"], "handshake line: {line:?}");
    assert_eq!(fields[4], "grpc", "handshake line: {line:?}");
    let socket = PathBuf::from(fields[3]);
    assert!(
        socket.starts_with(socket_dir.path()),
        "the socket {} is not in PLUGIN_UNIX_SOCKET_DIR",
        socket.display()
    );
    let der = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(fields[5])
        .expect("the certificate is base64 without padding");
    Running {
        child,
        socket,
        server_cert_pem: pem("CERTIFICATE", &der),
        _socket_dir: socket_dir,
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ascii"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// A TLS channel over the provider's unix socket, presenting `identity` (or nothing).
async fn channel(running: &Running, identity: Option<&ClientCert>) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&running.server_cert_pem))
        .domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
    }
    let socket = running.socket.clone();
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(socket).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    Endpoint::from_static("https://localhost")
        .tls_config(tls)
        .map_err(|e| format!("{e:?}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(connector)
        .await
        .map_err(|e| format!("{e:?}"))
}

#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Empty {}

async fn unary<Req, Resp>(
    channel: Channel,
    path: &'static str,
    request: Req,
) -> Result<Resp, String>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| format!("{e:?}"))?;
    let codec: tonic::codec::ProstCodec<Req, Resp> = tonic::codec::ProstCodec::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    tokio::time::timeout(
        Duration::from_secs(10),
        grpc.unary(tonic::Request::new(request), path, codec),
    )
    .await
    .map_err(|_| "timed out".to_string())?
    .map(|r| r.into_inner())
    .map_err(|s| format!("{s:?}"))
}

/// go-plugin's health check: `plugin` must be SERVING (1).
async fn health(running: &Running, identity: Option<&ClientCert>) -> Result<i32, String> {
    let channel = channel(running, identity).await?;
    let response: HealthCheckResponse = unary(
        channel,
        "/grpc.health.v1.Health/Check",
        HealthCheckRequest {
            service: "plugin".to_string(),
        },
    )
    .await?;
    Ok(response.status)
}

#[tokio::test]
async fn only_the_client_certificate_terraform_gave_is_served_sigint_is_ignored_and_shutdown_ends_it(
) {
    let terraform = client_cert();
    let mut running = start(&terraform);

    assert_eq!(
        health(&running, Some(&terraform)).await,
        Ok(1),
        "the client with the certificate is served, `plugin` SERVING"
    );
    let anonymous = health(&running, None).await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate was served: {anonymous:?}"
    );
    let impostor = client_cert();
    let other = health(&running, Some(&impostor)).await;
    assert!(
        other.is_err(),
        "a client with another certificate was served: {other:?}"
    );
    // The refusals did not take the server down for its real client.
    assert_eq!(health(&running, Some(&terraform)).await, Ok(1));

    // Ctrl-C reaches the whole process group: the provider lives on (Terraform stops it
    // through the protocol), as go-plugin's servers do.
    let pid = running.child.id() as libc::pid_t;
    // SAFETY: kill sends a signal to our own child; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        running.child.try_wait().expect("wait").is_none(),
        "the provider died of SIGINT"
    );
    assert_eq!(health(&running, Some(&terraform)).await, Ok(1));

    // Terraform's goodbye: GRPCController.Shutdown, then the process exits on its own and
    // its socket is gone.
    let channel = channel(&running, Some(&terraform)).await.expect("connect");
    let _: Empty = unary(channel, "/plugin.GRPCController/Shutdown", Empty {})
        .await
        .expect("Shutdown");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = running.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the provider did not exit after Shutdown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit after Shutdown: {status}");
    assert!(!running.socket.exists(), "the socket outlived the provider");
}

/// Tries to connect to `socket` as the unprivileged user `nobody` (65534); the error text.
fn connect_as_nobody(socket: &Path) -> Result<(), String> {
    let output = Command::new("python3")
        .args([
            "-c",
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])",
        ])
        .arg(socket)
        .uid(65534)
        .gid(65534)
        .output()
        .map_err(|e| format!("run python3 as nobody: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[tokio::test]
async fn the_socket_cannot_be_opened_by_another_user() {
    let terraform = client_cert();
    let running = start(&terraform);
    let socket = std::fs::metadata(&running.socket).expect("the socket exists");
    let dir = std::fs::metadata(running.socket.parent().expect("a directory")).expect("dir");
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    assert_eq!(
        socket.uid(),
        uid,
        "the socket belongs to the provider's user"
    );
    assert_eq!(
        socket.mode() & 0o777,
        0o600,
        "socket mode {:o}",
        socket.mode()
    );
    assert_eq!(dir.mode() & 0o777, 0o700, "directory mode {:o}", dir.mode());

    // As root the test can be someone else: that user cannot even open the socket (root
    // itself could; the modes above are what holds everyone else off).
    if uid == 0 {
        let refused = connect_as_nobody(&running.socket);
        let Err(message) = refused else {
            panic!("user nobody connected to the provider's socket")
        };
        assert!(
            message.contains("Permission denied"),
            "nobody's connect failed for another reason: {message}"
        );
    }
    // The provider's own client still gets through.
    assert_eq!(health(&running, Some(&terraform)).await, Ok(1));
}
