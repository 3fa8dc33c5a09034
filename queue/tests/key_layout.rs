//! The key layout, tried on generated names: no two distinct queue names
//! that `check_name` accepts share a key, and every name it refuses is
//! refused with the name of the queue whose key it would be.

use std::collections::HashSet;

use proptest::prelude::*;
use workerpool_queue::keys::{KEY_PARTS, QueueKeys, check_name};

/// Every key of queue `q`, with the per-worker keys of `instances`.
fn keys_of(q: &QueueKeys, instances: &[String]) -> Vec<String> {
    let mut keys = vec![
        q.waiting().to_string(),
        q.retry(),
        q.scheduled(),
        q.dead(),
        q.workers(),
        q.unique(),
        q.unique_expiry(),
        q.rate(),
        q.stats_processed(),
        q.stats_failed(),
        q.stats_dead(),
        q.stats_recovered(),
        q.stats_duration(),
        q.stats_duration_sq(),
        q.fires(),
        q.wait_probe(),
    ];
    for instance in instances {
        keys.push(q.processing(instance));
        keys.push(q.worker(instance));
        // Job ids are as free as instances.
        keys.push(q.outcome(instance));
        keys.push(q.outcome_end(instance));
    }
    keys
}

/// Names made of colon-separated parts, the words of the layout among them
/// as often as plain ones, so that near misses are common.
/// The words are read off the keys themselves, not off [`KEY_PARTS`], so a
/// word missing there is found.
fn name() -> impl Strategy<Value = String> {
    let mut words: Vec<String> = keys_of(&QueueKeys::new("q"), &["i".into()])
        .iter()
        .flat_map(|key| key.split(':').map(str::to_string).collect::<Vec<_>>())
        .filter(|word| word != "q" && word != "i")
        .collect();
    words.sort();
    words.dedup();
    let part = prop_oneof![
        4 => proptest::sample::select(words),
        1 => Just(String::new()),
        1 => Just("{mail}".to_string()),
        3 => "[a-c~]{1,3}",
    ];
    proptest::collection::vec(part, 1..5).prop_map(|parts| parts.join(":"))
}

#[test]
fn every_key_of_a_queue_is_its_name_or_its_name_and_a_part_of_the_layout() {
    let q = QueueKeys::new("mail");
    for key in keys_of(&q, &["w~1".into(), "a:retry".into()]) {
        if key == "mail" {
            continue;
        }
        let rest = key.strip_prefix("mail:").expect("starts with the name");
        let part = rest.split(':').next().unwrap_or_default();
        assert!(KEY_PARTS.contains(&part), "{key}: {part} not in KEY_PARTS");
    }
}

#[test]
fn a_queue_named_for_another_queues_key_is_refused_with_that_queues_name() {
    let e = check_name("emails:retry").expect_err("the retry set of emails");
    assert!(
        e.contains("is the retry set of the queue \"emails\""),
        "{e}"
    );
    assert!(e.contains("for example \"emails-retry\""), "{e}");
    let e = check_name("emails:processing:pod-1~0000beef").expect_err("a processing list");
    assert!(
        e.contains("the queue \"emails\" (emails:processing:…)"),
        "{e}"
    );
    let e = check_name("{mail}:high:dead").expect_err("a dead list");
    assert!(
        e.contains("dead-letter list of the queue \"{mail}:high\""),
        "{e}"
    );
    for fine in [
        "emails",
        "retry",
        "retry:emails",
        "mail:high",
        "{mail}:low",
        "a:retrying",
    ] {
        assert_eq!(check_name(fine), Ok(()), "{fine}");
    }
    for bad in ["", " ", "a b"] {
        assert!(check_name(bad).is_err(), "{bad:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        max_global_rejects: 200_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_two_distinct_valid_names_share_a_key(
        a in name(),
        b in name(),
        extend in any::<bool>(),
        instances in proptest::collection::vec(name(), 0..3),
    ) {
        // Half the time one name extends the other, as colliding names do.
        let b = if extend { format!("{a}:{b}") } else { b };
        prop_assume!(a != b && check_name(&a).is_ok() && check_name(&b).is_ok());
        let ka: HashSet<String> = keys_of(&QueueKeys::new(a.clone()), &instances).into_iter().collect();
        let kb: HashSet<String> = keys_of(&QueueKeys::new(b.clone()), &instances).into_iter().collect();
        let shared: Vec<_> = ka.intersection(&kb).collect();
        prop_assert!(shared.is_empty(), "{a} and {b} share {shared:?}");
    }

    #[test]
    fn every_key_but_the_list_is_refused_as_a_name_naming_its_queue(
        a in name(),
        instance in name(),
    ) {
        prop_assume!(check_name(&a).is_ok());
        for key in keys_of(&QueueKeys::new(a.clone()), std::slice::from_ref(&instance)) {
            if key == a {
                continue;
            }
            let refused = check_name(&key);
            prop_assert!(refused.is_err(), "{key} accepted");
            let message = refused.err().unwrap_or_default();
            prop_assert!(message.contains(&format!("the queue {a:?}")), "{key}: {message}");
        }
    }
}
