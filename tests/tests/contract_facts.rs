//! The client libraries' copies of the queue contract's facts
//! (`contract.json`) are generated from the queue crate: regenerate them
//! with `UPDATE_MANIFESTS=1 cargo test -p workerpool-tests --test contract_facts`.

use workerpool_tests::root;

const COPIES: [&str; 2] = [
    "sdk/python/src/workerpool_client/contract.json",
    "sdk/node/contract.json",
];

#[test]
fn each_client_librarys_contract_json_is_the_one_the_queue_crate_generates() {
    let facts = serde_json::json!({
        "outcomes": workerpool_queue::outcome::facts(),
        "queue_names": workerpool_queue::keys::facts(),
    });
    let generated = format!(
        "{}\n",
        serde_json::to_string_pretty(&facts).expect("facts serialize")
    );
    for copy in COPIES {
        let path = root().join(copy);
        if std::env::var_os("UPDATE_MANIFESTS").is_some()
            && std::fs::read_to_string(&path).ok().as_deref() != Some(generated.as_str())
        {
            std::fs::write(&path, &generated)
                .unwrap_or_else(|e| panic!("cannot write {copy}: {e}"));
        }
        assert!(
            std::fs::read_to_string(&path).unwrap_or_default() == generated,
            "{copy} is stale (a contract fact changed in the queue crate): run `UPDATE_MANIFESTS=1 cargo test -p workerpool-tests --test contract_facts`"
        );
    }
}
