//! The local log store against object_store's contract, crashes and reuse.

use super::*;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!(
            "picomq-local-log-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn open(&self, segment_bytes: u64) -> LocalLogStore {
        let legacy = Arc::new(LocalFileSystem::new_with_prefix(&self.0).unwrap());
        LocalLogStore::open_with(&self.0.join("wal-log"), legacy, &self.0, segment_bytes).unwrap()
    }

    fn logs(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.0.join("wal-log"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".log"))
            .collect();
        names.sort();
        names
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn key(n: u64) -> Path {
    Path::from(format!("wal/0000000001/{n:012}.wal"))
}

fn body(n: u64, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (n as usize + i) as u8)
            .collect::<Vec<u8>>(),
    )
}

async fn keys(store: &LocalLogStore) -> Vec<String> {
    let mut k: Vec<String> = store
        .list(Some(&Path::from("wal")))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    k.sort();
    k
}

#[tokio::test]
async fn objects_round_trip_and_survive_reopening() {
    let dir = Dir::new("round-trip");
    let store = dir.open(4096);
    for n in 0..20 {
        store.put(&key(n), body(n, 700).into()).await.unwrap();
    }
    // Create-only: a taken key is refused, the object untouched.
    let err = store
        .put_opts(&key(3), body(99, 10).into(), PutMode::Create.into())
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "{err}"
    );
    assert_eq!(
        store.get(&key(3)).await.unwrap().bytes().await.unwrap(),
        body(3, 700)
    );
    assert_eq!(
        store.get_range(&key(4), 10..20).await.unwrap(),
        body(4, 700).slice(10..20)
    );
    assert_eq!(store.head(&key(5)).await.unwrap().size, 700);
    assert!(matches!(
        store.get(&key(77)).await.unwrap_err(),
        object_store::Error::NotFound { .. }
    ));
    // 4 KiB logs hold five 700-byte objects each.
    assert!(dir.logs().len() >= 4, "{:?}", dir.logs());
    for n in 0..5 {
        store.delete(&key(n)).await.unwrap();
    }
    assert_eq!(keys(&store).await.len(), 15);
    // Overwrite replaces.
    store.put(&key(9), body(1000, 33).into()).await.unwrap();
    drop(store);

    let store = dir.open(4096);
    let listed = keys(&store).await;
    assert_eq!(listed.len(), 15, "{listed:?}");
    assert!(!listed.contains(&key(0).to_string()));
    for n in 5..20 {
        let expect = if n == 9 { body(1000, 33) } else { body(n, 700) };
        assert_eq!(
            store.get(&key(n)).await.unwrap().bytes().await.unwrap(),
            expect
        );
    }
    // Deleting everything removes every log but the one being written.
    for n in 5..20 {
        store.delete(&key(n)).await.unwrap();
    }
    assert!(keys(&store).await.is_empty());
    assert!(dir.logs().len() <= 2, "{:?}", dir.logs());
    // An object larger than a log gets one of its own.
    store
        .put(&key(100), body(100, 10_000).into())
        .await
        .unwrap();
    drop(store);
    let store = dir.open(4096);
    assert_eq!(
        store.get(&key(100)).await.unwrap().bytes().await.unwrap(),
        body(100, 10_000)
    );
}

#[tokio::test]
async fn a_torn_write_is_not_an_object_after_a_crash() {
    let dir = Dir::new("torn");
    let store = dir.open(1 << 20);
    for n in 0..3 {
        store.put(&key(n), body(n, 500).into()).await.unwrap();
    }
    let last = {
        let state = store.state();
        let loc = state.index[&key(2)];
        (
            log_path(&dir.0.join("wal-log"), loc.log),
            loc.data_at(key(2).as_ref().len()),
        )
    };
    // A crash mid-write: the last entry's header reached the disk, part of its
    // data did not (the process never synced it, so never acknowledged it).
    drop(store);
    let f = OpenOptions::new().write(true).open(&last.0).unwrap();
    f.write_all_at(&[0xFF; 100], last.1 + 300).unwrap();
    drop(f);

    let store = dir.open(1 << 20);
    assert_eq!(
        keys(&store).await,
        vec![key(0).to_string(), key(1).to_string()]
    );
    // The next write seals that log; reading it by headers alone later must still
    // end before the torn entry.
    store.put(&key(3), body(3, 500).into()).await.unwrap();
    drop(store);
    let store = dir.open(1 << 20);
    assert_eq!(
        keys(&store).await,
        vec![key(0).to_string(), key(1).to_string(), key(3).to_string()]
    );
    assert_eq!(
        store.get(&key(1)).await.unwrap().bytes().await.unwrap(),
        body(1, 500)
    );
}

#[tokio::test]
async fn one_process_writes_a_log_directory_others_read_it() {
    let dir = Dir::new("writer");
    let writer = dir.open(1 << 20);
    writer.put(&key(1), body(1, 100).into()).await.unwrap();
    let reader = dir.open(1 << 20);
    assert_eq!(keys(&reader).await, vec![key(1).to_string()]);
    let err = reader.put(&key(2), body(2, 100).into()).await.unwrap_err();
    assert!(err.to_string().contains("another process"), "{err}");
    // Written after the reader read the directory.
    writer.put(&key(3), body(3, 100).into()).await.unwrap();
    drop(writer);
    // The reader may write now, and reads the directory afresh first: it keeps
    // the writer's last object and writes after it.
    reader.put(&key(4), body(4, 100).into()).await.unwrap();
    assert_eq!(
        keys(&reader).await,
        vec![key(1).to_string(), key(3).to_string(), key(4).to_string()]
    );
    drop(reader);
    let again = dir.open(1 << 20);
    assert_eq!(
        again.get(&key(3)).await.unwrap().bytes().await.unwrap(),
        body(3, 100)
    );
    assert_eq!(
        again.get(&key(4)).await.unwrap().bytes().await.unwrap(),
        body(4, 100)
    );
}

/// Random puts, creates, deletes and reopenings, some of them concurrent, against
/// a model: the store holds exactly what the model says, before and after every
/// reopening, across log rollovers and removals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behaves_like_a_map_through_random_operations_and_reopenings() {
    let dir = Dir::new("model");
    let mut rng = fastrand::Rng::with_seed(7);
    let mut model: BTreeMap<String, Bytes> = BTreeMap::new();
    let mut store = dir.open(16 << 10);
    for round in 0..40 {
        // A burst of concurrent creates of fresh keys (what the WAL does).
        let fresh: Vec<u64> = (0..rng.usize(1..8))
            .map(|i| 1_000 * round + i as u64)
            .collect();
        let writes = fresh.iter().map(|&n| {
            let store = store.clone();
            let data = body(n, rng.usize(0..3_000));
            async move {
                store
                    .put_opts(&key(n), data.clone().into(), PutMode::Create.into())
                    .await
                    .map(|_| (key(n).to_string(), data))
            }
        });
        for written in futures::future::join_all(writes).await {
            let (k, data) = written.unwrap();
            model.insert(k, data);
        }
        // Deletes and overwrites of random existing keys.
        for _ in 0..rng.usize(0..6) {
            let Some(k) = model.keys().nth(rng.usize(0..model.len().max(1))).cloned() else {
                break;
            };
            if rng.bool() {
                store.delete(&Path::from(k.as_str())).await.unwrap();
                model.remove(&k);
            } else {
                let data = body(rng.u64(..), rng.usize(0..2_000));
                store
                    .put(&Path::from(k.as_str()), data.clone().into())
                    .await
                    .unwrap();
                model.insert(k, data);
            }
        }
        if rng.usize(0..4) == 0 {
            drop(store);
            store = dir.open(16 << 10);
        }
        assert_eq!(
            keys(&store).await,
            model.keys().cloned().collect::<Vec<_>>()
        );
        for (k, data) in &model {
            let got = store.get(&Path::from(k.as_str())).await.unwrap();
            assert_eq!(&got.bytes().await.unwrap(), data, "{k}");
        }
    }
    // Logs whose objects are all gone were removed: what is left holds the model.
    let live: u64 = model.values().map(|d| d.len() as u64 + 100).sum();
    let on_disk: u64 = dir
        .logs()
        .iter()
        .map(|n| {
            std::fs::metadata(dir.0.join("wal-log").join(n))
                .unwrap()
                .len()
        })
        .sum();
    assert!(
        on_disk <= live * 4 + (64 << 10),
        "{on_disk} bytes of logs for {live} live"
    );
}

fn inode(path: &FsPath) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// Epoch claims and seals, never deleted, get logs of their own: a shared log
/// they landed in would never empty, and would keep its deleted objects' bytes.
#[tokio::test]
async fn claims_and_seals_never_pin_a_shared_log() {
    let dir = Dir::new("pinned");
    let store = dir.open(4096);
    let claim = Path::from("epochs/0000000002");
    let seal = key(1000);
    let seal_body = [&crate::wal::format::SEAL_MAGIC[..], b"sealed"].concat();
    store.put(&key(0), body(0, 700).into()).await.unwrap();
    store
        .put(&claim, Bytes::from_static(b"claim").into())
        .await
        .unwrap();
    store.put(&seal, seal_body.clone().into()).await.unwrap();
    // Enough to retire the first log (five 700-byte objects fill 4 KiB).
    for n in 1..10 {
        store.put(&key(n), body(n, 700).into()).await.unwrap();
    }
    let shared = store.state().index[&key(0)].log;
    for kept in [&claim, &seal] {
        let log = store.state().index[kept].log;
        assert_ne!(log, shared, "{kept} is in the shared log");
    }
    // Emptied, the shared log goes (to be reused).
    for n in 0..10 {
        if store.state().index[&key(n)].log == shared {
            store.delete(&key(n)).await.unwrap();
        }
    }
    let logs = dir.0.join("wal-log");
    assert!(!log_path(&logs, shared).exists(), "{:?}", dir.logs());
    drop(store);
    let store = dir.open(4096);
    assert_eq!(
        store.get(&claim).await.unwrap().bytes().await.unwrap(),
        Bytes::from_static(b"claim")
    );
    assert_eq!(
        store.get(&seal).await.unwrap().bytes().await.unwrap(),
        seal_body
    );
}

/// Emptied logs become new ones; what they held never comes back, in the process
/// that reused them, after reopening, or in a reader that had them open.
#[tokio::test]
async fn emptied_logs_are_reused_and_their_old_objects_stay_gone() {
    let dir = Dir::new("reuse");
    let logs = dir.0.join("wal-log");
    let writer = dir.open(4096);
    // 4 KiB logs hold five 700-byte objects each: 0..5 fill the first log.
    for n in 0..12 {
        writer.put(&key(n), body(n, 700).into()).await.unwrap();
    }
    let first = writer.state().index[&key(0)].log;
    let first_inode = inode(&log_path(&logs, first));
    let reader = dir.open(4096);
    for n in 0..5 {
        writer.delete(&key(n)).await.unwrap();
    }
    assert!(free_path(&logs, first).exists(), "{:?}", dir.logs());
    assert!(!log_path(&logs, first).exists());
    for n in 100..130 {
        writer.put(&key(n), body(n, 700).into()).await.unwrap();
    }
    let reused = dir
        .logs()
        .iter()
        .any(|name| inode(&logs.join(name)) == first_inode);
    assert!(reused, "the emptied log was not reused: {:?}", dir.logs());
    // The reader still maps key 0 into that file, which now holds other objects.
    assert!(
        matches!(
            reader.get(&key(0)).await.unwrap_err(),
            object_store::Error::NotFound { .. }
        ),
        "a reader returned bytes of a reused log"
    );
    assert_eq!(
        reader.get(&key(7)).await.unwrap().bytes().await.unwrap(),
        body(7, 700)
    );
    let live: Vec<u64> = (5..12).chain(100..130).collect();
    drop(reader);
    drop(writer);
    let store = dir.open(4096);
    let mut expect: Vec<String> = live.iter().map(|&n| key(n).to_string()).collect();
    expect.sort();
    assert_eq!(keys(&store).await, expect);
    for &n in &live {
        assert_eq!(
            store.get(&key(n)).await.unwrap().bytes().await.unwrap(),
            body(n, 700)
        );
    }
    // At most FREE_MAX emptied logs are kept.
    for &n in &live {
        store.delete(&key(n)).await.unwrap();
    }
    let free = std::fs::read_dir(&logs)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".free")
        })
        .count();
    assert!((1..=FREE_MAX).contains(&free), "{free} free logs");
}

/// A log's salt is in every entry's checksum, so bytes left from an earlier use of
/// the file, or written as data by a client, never read as an entry of the log,
/// even with its id.
#[test]
fn an_entry_without_its_logs_salt_ends_the_log() {
    let dir = Dir::new("salt");
    let logs = dir.0.join("wal-log");
    std::fs::create_dir_all(&logs).unwrap();
    let (file, salt) = create_log(&logs, 5, 4096, None).unwrap();
    let k = key(1);
    let data = body(1, 100);
    for (entry_salt, found) in [(None, 0), (Some(salt ^ 1), 0), (Some(salt), 1)] {
        let head = encode_head(5, entry_salt, k.as_ref(), 100, crc32c::crc32c(&data), 0);
        write_entry(&file, LOG_HEADER, &head, &data).unwrap();
        let scanned = scan(&file, 5).unwrap().unwrap();
        assert_eq!(scanned.entries.len(), found, "salt {entry_salt:?}");
    }
}

/// Logs of format 1 (no salt) from the version before reuse open and read as
/// before, and are reused like any other once emptied.
#[tokio::test]
async fn logs_of_format_1_stay_readable() {
    let dir = Dir::new("format-1");
    let logs = dir.0.join("wal-log");
    std::fs::create_dir_all(&logs).unwrap();
    let file = File::create_new(log_path(&logs, 1)).unwrap();
    let mut head = vec![0u8; LOG_HEADER as usize];
    head[..8].copy_from_slice(LOG_MAGIC_V1);
    head[8..16].copy_from_slice(&1u64.to_le_bytes());
    file.write_all_at(&head, 0).unwrap();
    file.set_len(4096).unwrap();
    let mut at = LOG_HEADER;
    for n in 0..3 {
        let data = body(n, 500);
        let k = key(n);
        let entry = encode_head(1, None, k.as_ref(), 500, crc32c::crc32c(&data), 0);
        write_entry(&file, at, &entry, &data).unwrap();
        at += entry_len(k.as_ref().len(), 500);
    }
    drop(file);
    let store = dir.open(4096);
    assert_eq!(
        keys(&store).await,
        (0..3).map(|n| key(n).to_string()).collect::<Vec<_>>()
    );
    assert_eq!(
        store.get(&key(1)).await.unwrap().bytes().await.unwrap(),
        body(1, 500)
    );
    store.put(&key(9), body(9, 500).into()).await.unwrap();
    for n in 0..3 {
        store.delete(&key(n)).await.unwrap();
    }
    assert!(free_path(&logs, 1).exists(), "{:?}", dir.logs());
    drop(store);
    let store = dir.open(4096);
    assert_eq!(keys(&store).await, vec![key(9).to_string()]);
}

#[tokio::test]
async fn wal_files_of_earlier_versions_stay_readable() {
    let dir = Dir::new("legacy");
    let files = LocalFileSystem::new_with_prefix(&dir.0).unwrap();
    files.put(&key(1), body(1, 50).into()).await.unwrap();
    let store = dir.open(1 << 20);
    store.put(&key(2), body(2, 50).into()).await.unwrap();
    assert_eq!(
        keys(&store).await,
        vec![key(1).to_string(), key(2).to_string()]
    );
    assert_eq!(
        store.get(&key(1)).await.unwrap().bytes().await.unwrap(),
        body(1, 50)
    );
    let err = store
        .put_opts(&key(1), body(9, 5).into(), PutMode::Create.into())
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "{err}"
    );
    store.delete(&key(1)).await.unwrap();
    assert_eq!(keys(&store).await, vec![key(2).to_string()]);
    drop(store);
    let store = dir.open(1 << 20);
    assert_eq!(keys(&store).await, vec![key(2).to_string()]);
    assert!(!dir.0.join(key(1).as_ref()).exists());
}

/// A put written on the caller's thread (the WAL writer's hint for a lone commit)
/// keeps every promise of one through the blocking pool: create-only, durable,
/// readable, and there after reopening.
#[tokio::test]
async fn a_put_on_the_callers_thread_is_the_same_object() {
    let dir = Dir::new("on-caller");
    let store = dir.open(1 << 20);
    let create = || {
        let mut opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        opts.extensions.insert(crate::store::WriteOnCaller);
        opts
    };
    store
        .put_opts(&key(1), PutPayload::from(body(1, 300)), create())
        .await
        .unwrap();
    store
        .put_opts(
            &key(2),
            PutPayload::from(body(2, 5_000)),
            PutOptions::default(),
        )
        .await
        .unwrap();
    let again = store
        .put_opts(&key(1), PutPayload::from(body(9, 300)), create())
        .await;
    assert!(
        matches!(again, Err(object_store::Error::AlreadyExists { .. })),
        "{again:?}"
    );
    drop(store);
    let store = dir.open(1 << 20);
    for (n, len) in [(1, 300), (2, 5_000)] {
        let got = store.get(&key(n)).await.unwrap().bytes().await.unwrap();
        assert_eq!(got, body(n, len));
    }
}
