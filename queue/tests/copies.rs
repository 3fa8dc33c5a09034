//! A large job is not copied on its way through the worker: reading the
//! stamped payload into a job, the line a handler gets, and the settle
//! that removes it from the processing list allocate nothing near the
//! payload's size. A counting allocator (this test binary's alone) counts
//! the allocations of at least a quarter of the payload; counts, not
//! times, so the check does not depend on the machine.
//!
//! One test in the binary: the count is process-wide, and a second test
//! running beside it would add its own allocations.

// The one unsafe item is the allocator below, which only forwards to the
// system allocator and counts: a global allocator cannot be written
// without `unsafe impl GlobalAlloc`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use workerpool_queue::job::{Stamp, take_stamped};
use workerpool_queue::keys::QueueKeys;
use workerpool_queue::ops;
use workerpool_tests::TestRedis;

/// The payload's size.
const SIZE: usize = 4 * 1024 * 1024;
/// Allocations of this size or more are counted.
const LARGE: usize = SIZE / 4;

static LARGE_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call forwards to `System` with the caller's own arguments,
// so `System`'s guarantees hold unchanged; the counting touches no memory
// of the caller's.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE {
            LARGE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout (every
        // allocation here does).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE {
            LARGE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= LARGE {
            LARGE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: `ptr` came from `System` with `layout`; the caller
        // upholds `realloc`'s other conditions.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// How many large allocations `f` made.
fn large_allocations<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LARGE_ALLOCATIONS.load(Ordering::Relaxed);
    let out = f();
    (out, LARGE_ALLOCATIONS.load(Ordering::Relaxed) - before)
}

#[test]
fn a_large_job_is_read_handed_on_and_settled_without_a_copy() {
    // As the fetch script stamps a fresh job: `"attempt":1` added after
    // the brace, numbers and unknown fields as the producer wrote them.
    let add = r#""attempt":1,"#;
    let head = format!(r#"{{{add}"id":"big-1","enqueued_at":1767225600000,"task":"big","data":""#);
    let tail = r#"","f":1.10,"other":{"k":[1,2]}}"#;
    let mut payload = Vec::with_capacity(SIZE);
    payload.extend_from_slice(head.as_bytes());
    payload.resize(SIZE - tail.len(), b'x');
    payload.extend_from_slice(tail.as_bytes());
    let held = payload.clone();

    let ((job, text), copies) = large_allocations(|| {
        take_stamped(payload, Stamp::Fresh(add.len())).expect("a plain fresh job")
    });
    assert_eq!(copies, 0, "the reply's bytes become the job's text");
    assert_eq!(
        (job.id(), job.task(), job.attempt()),
        ("big-1", Some("big"), 1)
    );
    let (line, copies) = large_allocations(|| job.json_line());
    assert_eq!(copies, 0, "the handler's line is the held text");
    assert_eq!(line.as_bytes(), held.as_slice());

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let redis = TestRedis::start();
    let q = QueueKeys::new("copies");
    let w = "w~1";
    runtime.block_on(async {
        use redis::AsyncCommands;
        let mut c = redis.conn().await;
        let _: () = c
            .rpush(q.processing(w), held.as_slice())
            .await
            .expect("rpush");
        let done = ops::Settlement::Done;
        let finished = [ops::Finished {
            queue: 0,
            payload: text.as_bytes(),
            settlement: &done,
            release: None,
            kept: None,
        }];
        let before = LARGE_ALLOCATIONS.load(Ordering::Relaxed);
        let settled = ops::settle(&mut c, std::slice::from_ref(&q), w, &finished, 0, 10, None)
            .await
            .expect("settle");
        let copies = LARGE_ALLOCATIONS.load(Ordering::Relaxed) - before;
        assert_eq!(settled.0, [true]);
        assert_eq!(
            copies, 0,
            "the settle names the payload, it does not send it"
        );
        let left: usize = c.llen(q.processing(w)).await.expect("llen");
        assert_eq!(left, 0);
    });
}
