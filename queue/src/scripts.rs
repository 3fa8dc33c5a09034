//! Lua scripts that make each queue transition atomic.
//!
//! Every script that settles a job first removes that exact payload from the
//! worker's processing list and does its write only when the removal
//! happened. A job that a reaper has already returned to the queue is
//! therefore never completed, retried or dead-lettered a second time, and
//! two workers doing the same maintenance at once cannot both move a job.
//! Due times and heartbeats use the Redis server's clock (`TIME`).
//!
//! A script is also all or nothing when a key holds the wrong type: Redis
//! does not undo a script's writes when a later command fails, so every
//! script checks the type of each key it may write before its first write
//! (`guard.lua`), and stops with a `WRONGTYPE` error naming the key, having
//! changed nothing. Without that, a job removed from the processing list
//! and refused by a wrong-typed retry set would be in no key at all.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use redis::Script;

/// Every Lua file of the queue contract, by name: the scripts and the
/// pieces they are composed of. Each file's header says what it does.
const LUA: &[(&str, &str)] = &[
    ("guard.lua", include_str!("lua/guard.lua")),
    ("now.lua", include_str!("lua/now.lua")),
    ("clock.lua", include_str!("lua/clock.lua")),
    ("stamp.lua", include_str!("lua/stamp.lua")),
    ("rate.lua", include_str!("lua/rate.lua")),
    ("take.lua", include_str!("lua/take.lua")),
    ("unique.lua", include_str!("lua/unique.lua")),
    ("named.lua", include_str!("lua/named.lua")),
    ("outcome.lua", include_str!("lua/outcome.lua")),
    ("fetch.lua", include_str!("lua/fetch.lua")),
    ("settle.lua", include_str!("lua/settle.lua")),
    ("settle_intake.lua", include_str!("lua/settle_intake.lua")),
    ("enqueue.lua", include_str!("lua/enqueue.lua")),
    ("fire.lua", include_str!("lua/fire.lua")),
    ("give_back.lua", include_str!("lua/give_back.lua")),
    ("promote.lua", include_str!("lua/promote.lua")),
    ("heartbeat.lua", include_str!("lua/heartbeat.lua")),
    ("reap.lua", include_str!("lua/reap.lua")),
    ("deregister.lua", include_str!("lua/deregister.lua")),
    ("resurrect.lua", include_str!("lua/resurrect.lua")),
    ("remove.lua", include_str!("lua/remove.lua")),
    ("purge.lua", include_str!("lua/purge.lua")),
    ("dead_pick.lua", include_str!("lua/dead_pick.lua")),
    ("start.lua", include_str!("lua/start.lua")),
    ("progress.lua", include_str!("lua/progress.lua")),
    ("cancel.lua", include_str!("lua/cancel.lua")),
];

/// What every script runs with: `expect()` (`guard.lua`) and `now`, the
/// server clock read once (`now.lua`).
const PLAIN: &[&str] = &["guard.lua", "now.lua"];

/// The intake's settle, which ends jobs, adds `release()`, which frees a
/// finished job's unique key (`unique.lua`), and `named()`, which finds a
/// large payload the worker names by its length and digest rather than
/// sending it (`named.lua`).
const ENDING: &[&str] = &[
    "guard.lua",
    "now.lua",
    "unique.lua",
    "named.lua",
    "outcome.lua",
];

/// The scripts that take jobs read the clock only when they need it
/// (`now()`, `clock.lua` in place of `now.lua`), and add the intake stamp,
/// the rate-limit bucket, the outcome a kept job starts with as it is
/// taken, `take_jobs()` and `release()`.
const TAKING: &[&str] = &[
    "guard.lua",
    "clock.lua",
    "stamp.lua",
    "rate.lua",
    "outcome.lua",
    "take.lua",
    "unique.lua",
];

/// The settle takes jobs as the taking scripts do, finds a large payload
/// the worker names by its length and digest (`named.lua`), and writes
/// kept outcomes (`outcome.lua`).
const SETTLING: &[&str] = &[
    "guard.lua",
    "clock.lua",
    "stamp.lua",
    "rate.lua",
    "outcome.lua",
    "take.lua",
    "unique.lua",
    "named.lua",
];

/// The scripts that write a kept job's outcome as they move it add the
/// outcome's writes (`outcome.lua`).
const KEEPING: &[&str] = &["guard.lua", "now.lua", "outcome.lua"];

/// How each script is composed: its file and the pieces put in front of
/// it, in order. Each file's first line names the same pieces
/// (`-- uses: ...`; a test holds the two to each other). A piece written
/// `file as name(args)` goes in as `local function name(args) ... end`.
const COMPOSED: &[(&str, &[&str])] = &[
    ("fetch.lua", TAKING),
    ("settle.lua", SETTLING),
    ("settle_intake.lua", ENDING),
    ("enqueue.lua", KEEPING),
    (
        "fire.lua",
        &[
            "guard.lua",
            "now.lua",
            "outcome.lua",
            "enqueue.lua as enqueue(KEYS, ARGV)",
        ],
    ),
    ("give_back.lua", KEEPING),
    ("promote.lua", PLAIN),
    ("heartbeat.lua", PLAIN),
    ("reap.lua", KEEPING),
    ("start.lua", KEEPING),
    ("progress.lua", PLAIN),
    (
        "cancel.lua",
        &["guard.lua", "now.lua", "unique.lua", "outcome.lua"],
    ),
    ("deregister.lua", PLAIN),
    ("resurrect.lua", PLAIN),
    ("remove.lua", PLAIN),
    ("purge.lua", PLAIN),
    ("dead_pick.lua", PLAIN),
];

/// The text of a Lua file of [`LUA`].
fn lua(file: &str) -> &'static str {
    match LUA.iter().find(|(name, _)| *name == file) {
        Some((_, text)) => text,
        None => panic!("{file} is not one of the queue's Lua files"),
    }
}

/// The whole source of the script `file` of [`COMPOSED`]: its pieces, then
/// the file.
fn source(file: &str) -> String {
    let Some((_, pieces)) = COMPOSED.iter().find(|(name, _)| *name == file) else {
        panic!("{file} is not one of the composed scripts");
    };
    let mut source = String::new();
    for piece in *pieces {
        match piece.split_once(" as ") {
            Some((name, function)) => {
                source.push_str(&format!("local function {function}\n{}\nend\n", lua(name)));
            }
            None => source.push_str(lua(piece)),
        }
    }
    source.push_str(lua(file));
    source
}

/// The script `file` of [`COMPOSED`], remembered for [`command_at`].
pub(crate) fn composed(file: &str) -> Script {
    registered(source(file))
}

/// The source of every script built so far, by SHA1: what a refusal
/// inside a script (an ACL without one of its commands) is traced back
/// with ([`command_at`]).
static SOURCES: LazyLock<Mutex<HashMap<String, String>>> = LazyLock::new(Default::default);

/// A script from its whole source, remembered for [`command_at`].
fn registered(source: String) -> Script {
    let script = Script::new(&source);
    SOURCES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(script.get_hash().to_string(), source);
    script
}

/// The Redis command that line `line` (1-based, as Redis counts in
/// `@user_script:<line>`) of the script with SHA1 `sha` calls, lower case,
/// if the script is one of workerpool's and the line calls one command.
pub fn command_at(sha: &str, line: usize) -> Option<String> {
    let sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
    let text = sources.get(sha)?.lines().nth(line.checked_sub(1)?)?;
    let mut names = text.match_indices("call(").filter_map(|(at, _)| {
        let rest = text[at + "call(".len()..].trim_start();
        let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let name = rest[1..].split(quote).next()?;
        Some(name.to_ascii_lowercase())
    });
    let first = names.next()?;
    names.all(|n| n == first).then_some(first)
}

/// The whole text of [`FETCH`].
pub(crate) static FETCH_SOURCE: LazyLock<String> = LazyLock::new(|| source("fetch.lua"));

/// Takes up to `ARGV[1]` jobs from the queues in `KEYS` (five per queue:
/// queue, processing list, rate bucket, dead list, stats:dead; highest
/// priority first), each moved atomically and stamped on the way
/// (`stamp.lua`: see [`crate::job::Stamp`]), no more from a queue than its
/// rate limit allows (`rate.lua`); a payload over the size limit is
/// dead-lettered as `too_large` instead, whole (`take.lua`). ARGV: the
/// count, the attempt limit, the ids for fresh jobs (32 hex digits each,
/// concatenated), the limit's interval and tolerance in ms (interval 0:
/// none), the size limit in bytes (0: none), the instance. Returns one flat
/// array: the queue the limit stopped and the ms until its next start
/// (`0, -1` when no limit stopped it), then groups of a queue index
/// (1-based) and a count, each followed by that many pairs of payload as
/// held and stamp (a dead-lettered payload: its error and -2).
pub static FETCH: LazyLock<Script> = LazyLock::new(|| registered(FETCH_SOURCE.clone()));

/// Settles freshly fetched payloads that need more than the fetch script's
/// stamp: stamped, scheduled or dead-lettered, a kept job's outcome
/// written with it. The header of `lua/settle_intake.lua` says its KEYS
/// and ARGV.
pub static SETTLE_INTAKE: LazyLock<Script> = LazyLock::new(|| composed("settle_intake.lua"));

/// Enqueues jobs, refusing those whose unique key another job holds, and
/// writes a kept job's outcome `waiting` or `scheduled`. The header of
/// `lua/enqueue.lua` says its KEYS and ARGV.
pub static ENQUEUE: LazyLock<Script> = LazyLock::new(|| composed("enqueue.lua"));

/// Settles finished jobs (done, retried later, dead-lettered, cancelled)
/// in one round trip, with their kept outcomes, and takes the next jobs
/// into the slots they free as [`FETCH`] does. The header of
/// `lua/settle.lua` says its KEYS, ARGV and reply.
pub static SETTLE: LazyLock<Script> = LazyLock::new(|| composed("settle.lua"));

/// Puts jobs back at the head of the queue (they run next), a kept job's
/// outcome `waiting` again. The header of `lua/give_back.lua` says its
/// KEYS and ARGV.
pub static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| composed("give_back.lua"));

/// A kept job's attempt starts: `running`, unless a cancel was asked for.
/// The header of `lua/start.lua` says its KEYS, ARGV and reply.
pub static START: LazyLock<Script> = LazyLock::new(|| composed("start.lua"));

/// A running kept job's progress. The header of `lua/progress.lua` says
/// its KEYS, ARGV and reply.
pub static PROGRESS: LazyLock<Script> = LazyLock::new(|| composed("progress.lua"));

/// Cancels a job by id. The header of `lua/cancel.lua` says its KEYS, ARGV
/// and reply.
pub static CANCEL: LazyLock<Script> = LazyLock::new(|| composed("cancel.lua"));

/// Moves due entries of the retry and scheduled sets to the tail of the
/// queue. KEYS: retry, scheduled, queue. ARGV: the most to move per set.
/// Returns how many moved.
pub static PROMOTE: LazyLock<Script> = LazyLock::new(|| composed("promote.lua"));

/// Records a heartbeat. KEYS: workers, worker hash. ARGV: instance,
/// hash TTL in milliseconds, then field/value pairs for the hash.
/// Returns {1 if the instance was not registered (new, or reaped), now}.
pub static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| composed("heartbeat.lua"));

/// Returns a lost worker's jobs to the head of the queue, oldest taken at
/// the very head, and forgets the worker. KEYS: workers, its processing
/// list, queue, its hash, stats:recovered, then the outcome hashes of its
/// jobs that may keep one (each still running there is written
/// `waiting`). ARGV: instance, silence in
/// milliseconds after which it counts as lost (-1: lost regardless, for a
/// worker's own earlier incarnations). The silence is checked again here,
/// so a worker that has just beaten is left alone and concurrent reapers
/// move each job once. Returns the number of jobs moved, or -1 if the
/// worker was not lost.
pub static REAP: LazyLock<Script> = LazyLock::new(|| composed("reap.lua"));

/// Removes a worker from the registry when it holds no jobs. KEYS:
/// workers, its processing list, its hash. ARGV: instance.
pub static DEREGISTER: LazyLock<Script> = LazyLock::new(|| composed("deregister.lua"));

/// Moves dead letters back onto the queue for a fresh start. KEYS: dead,
/// queue. ARGV: pairs of the dead-letter entry as stored and the payload to
/// push. An entry is moved only if it is still in the dead list, so two
/// operators retrying at once move each job once. Returns how many moved.
pub static RESURRECT: LazyLock<Script> = LazyLock::new(|| composed("resurrect.lua"));

/// Removes the given entries from a list. KEYS: the list. ARGV: entries
/// as stored. Returns how many were removed.
pub static REMOVE: LazyLock<Script> = LazyLock::new(|| composed("remove.lua"));

/// Removes a whole list in one step. KEYS: the list. Returns how many
/// entries it had.
pub static PURGE: LazyLock<Script> = LazyLock::new(|| composed("purge.lua"));

/// Claims one fire of a recurring schedule and enqueues its job as
/// [`ENQUEUE`] does, in one script: `enqueue.lua` runs inside it as a
/// function. KEYS: queue, scheduled, unique, unique:expiry, fires. ARGV:
/// the schedule, the fire time in unix ms, the payload, its id, its unique
/// key ('' for none), the hold in ms. Returns `{1, at}` enqueued, `{0, at}`
/// claimed and refused as a duplicate, `{-1, latest}` claimed before.
pub static FIRE: LazyLock<Script> = LazyLock::new(|| composed("fire.lua"));

/// Removes dead letters found by their digest, or (`Q`) moves the payload
/// a too_large one keeps back onto the queue. KEYS: dead, queue. ARGV: the
/// action, then triples of index from the oldest end, length, SHA-1.
/// Returns per triple 1 done, 0 gone, -1 left (not a too_large entry).
pub static DEAD_PICK: LazyLock<Script> = LazyLock::new(|| composed("dead_pick.lua"));

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The pieces a Lua file's `-- uses:` line names, in order (split at
    /// the commas outside parentheses), if its header has one.
    fn uses(text: &str) -> Option<Vec<&str>> {
        let line = text
            .lines()
            .take_while(|l| l.starts_with("--"))
            .find_map(|l| l.strip_prefix("-- uses:"))?;
        let (mut pieces, mut depth, mut start) = (Vec::new(), 0, 0);
        for (i, c) in line.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    pieces.push(line[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        pieces.push(line[start..].trim());
        Some(pieces)
    }

    #[test]
    fn a_uses_line_is_read_from_the_header_only() {
        assert_eq!(
            uses("-- uses: guard.lua, now.lua\n-- Does a thing.\nlocal a = 1\n"),
            Some(vec!["guard.lua", "now.lua"])
        );
        assert_eq!(
            uses("-- Does a thing.\nlocal a = 1\n-- uses: now.lua\n"),
            None
        );
    }

    /// Every script's `-- uses:` line names exactly the pieces [`COMPOSED`]
    /// puts in front of it, in order: a file that gets pieces and has no
    /// such line fails, and so does a line naming a piece that is not put
    /// there, or a line in a file that is not composed.
    #[test]
    fn every_script_names_the_pieces_it_is_composed_of() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lua");
        let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
            .expect("the Lua directory")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.ends_with(".lua"))
            .collect();
        let known: BTreeSet<String> = LUA.iter().map(|(name, _)| name.to_string()).collect();
        assert_eq!(on_disk, known, "every Lua file is in LUA");
        for (file, text) in LUA {
            let composed = COMPOSED
                .iter()
                .find(|(name, _)| name == file)
                .map(|(_, pieces)| pieces.to_vec());
            assert_eq!(uses(text), composed, "{file}: its `-- uses:` line");
        }
        // And the pieces are what goes in front, in that order.
        for (file, pieces) in COMPOSED {
            let source = source(file);
            let mut at = 0;
            for piece in *pieces {
                let name = piece.split(" as ").next().unwrap_or(piece);
                let found = source[at..]
                    .find(lua(name))
                    .unwrap_or_else(|| panic!("{file}: {name} is not in its source"));
                at += found + lua(name).len();
            }
            // Only a wrapped piece's `end` stands between them and the file.
            let between = source[at..].strip_suffix(lua(file));
            assert!(
                between.is_some_and(|b| ["", "end"].contains(&b.trim())),
                "{file}: the file after its pieces"
            );
        }
    }

    #[test]
    fn a_script_line_is_traced_to_the_command_it_calls() {
        let sha = FETCH.get_hash().to_string();
        let source = SOURCES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&sha)
            .cloned()
            .expect("FETCH is registered");
        let line = source
            .lines()
            .position(|l| l.contains("redis.call('RPOP'"))
            .expect("the taking script pops")
            + 1;
        assert_eq!(command_at(&sha, line).as_deref(), Some("rpop"));
        let time = source
            .lines()
            .position(|l| l.contains("redis.call('TIME')"))
            .expect("the clock")
            + 1;
        assert_eq!(command_at(&sha, time).as_deref(), Some("time"));
        assert_eq!(command_at(&sha, 0), None);
        assert_eq!(command_at("not-a-script", 1), None);
    }
}
