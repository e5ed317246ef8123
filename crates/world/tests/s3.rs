//! The blob store on an S3-compatible server (moto's S3 server, a real HTTP
//! implementation of the S3 API; `.ci/run` installs it from PyPI).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use steadfast_world::Blobs;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_s3() -> (Server, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Server(
        Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server must be installed (pip install 'moto[server]'; see .ci/run)"),
    );
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (server, url);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("moto_server did not start");
}

#[tokio::test]
async fn blobs_round_trip_through_an_s3_compatible_store() {
    let (_server, endpoint) = start_s3();
    let made = Command::new("curl")
        .args(["-sf", "-X", "PUT", &format!("{endpoint}/steadfast-test")])
        .status()
        .unwrap();
    assert!(made.success(), "bucket created");
    std::env::set_var("AWS_ENDPOINT", &endpoint);
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_REGION", "us-east-1");

    let blobs = Blobs::open("s3://steadfast-test/runs/one").unwrap();
    let data = b"\x1b[31mred\x1b[0m and a lot more output".repeat(3000);
    let r = blobs.put(&data).await.unwrap();
    assert_eq!(r.uri, format!("s3://steadfast-test/runs/one/{}", r.hash));
    assert!(r.head.starts_with("red and a lot"));
    assert_eq!(blobs.get(&r.hash).await.unwrap(), data);

    // The object is in the bucket under the prefix, as plain S3 sees it.
    let listing = Command::new("curl")
        .args([
            "-sf",
            &format!("{endpoint}/steadfast-test?list-type=2&prefix=runs/one/"),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listing.stdout).contains(&format!("runs/one/{}", r.hash)));

    blobs.delete(&r.hash).await.unwrap();
    assert!(blobs.get(&r.hash).await.is_err());
    blobs.delete(&r.hash).await.unwrap(); // deleting twice is fine
    assert!(Blobs::open("s3:///nobucket").is_err());
}
