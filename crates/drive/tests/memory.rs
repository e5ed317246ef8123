//! A snapshot streams file contents: its memory does not grow with a file's size.
//! (Alone in its test binary, so the process's peak resident size is this test's.)

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_300_mb_file_is_snapshotted_and_restored_in_bounded_memory() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    {
        let mut f = std::fs::File::create(ws.join("big.bin")).unwrap();
        let chunk: Vec<u8> = (0..1_048_576u32).map(|i| (i % 253) as u8).collect();
        for i in 0..300u32 {
            let mut c = chunk.clone();
            c[..4].copy_from_slice(&i.to_le_bytes()); // no two chunks alike
            f.write_all(&c).unwrap();
        }
    }
    let drive = steadfast_drive::Drive::open(dir.path().join("drive")).unwrap();
    let before = peak_rss_kib();
    let id = drive.snapshot(&ws).unwrap();
    std::fs::remove_file(ws.join("big.bin")).unwrap();
    drive.restore(&ws, &id).unwrap();
    let grown = peak_rss_kib().saturating_sub(before);
    assert_eq!(
        std::fs::metadata(ws.join("big.bin")).unwrap().len(),
        300 * 1_048_576
    );
    assert!(
        grown < 64 * 1024,
        "peak resident memory grew by {grown} KiB"
    );
}
