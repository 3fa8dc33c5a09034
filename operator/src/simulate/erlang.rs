//! The physical bound on steady traffic: the fewest servers an M/M/c queue
//! needs for a given wait (Erlang's C formula), to print beside what a
//! policy spent.

/// The probability that an arrival waits, with `servers` servers and an
/// offered load of `load` Erlangs (arrival rate × mean service time):
/// Erlang's C formula, through the stable recursion of Erlang's B.
/// 1 when the servers cannot keep up.
pub fn wait_probability(servers: u32, load: f64) -> f64 {
    let n = f64::from(servers);
    if servers == 0 || load >= n {
        return 1.0;
    }
    let mut b = 1.0;
    for k in 1..=servers {
        b = load * b / (f64::from(k) + load * b);
    }
    n * b / (n - load * (1.0 - b))
}

/// The fewest servers with which at most 5 % of jobs wait longer than
/// `wait_s` (M/M/c: `P(W > t) = C · e^(-(cμ - λ)t)`), for `rate` jobs a
/// second of mean `mean_s` seconds. `None` without traffic.
pub fn servers_for_p95(rate: f64, mean_s: f64, wait_s: f64) -> Option<u32> {
    if !(rate > 0.0 && mean_s > 0.0 && rate.is_finite() && mean_s.is_finite()) {
        return None;
    }
    let load = rate * mean_s;
    let mu = 1.0 / mean_s;
    let start = load.floor() as u32 + 1;
    (start..start.saturating_add(100_000)).find(|&c| {
        let tail =
            wait_probability(c, load) * (-(f64::from(c) * mu - rate) * wait_s.max(0.0)).exp();
        tail <= 0.05
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erlang_c_matches_the_textbook_values() {
        // a = 2 Erlangs on 3 servers: C = 4/9.
        assert!((wait_probability(3, 2.0) - 4.0 / 9.0).abs() < 1e-12);
        // One server: C is the utilisation.
        assert!((wait_probability(1, 0.7) - 0.7).abs() < 1e-12);
        assert_eq!(wait_probability(2, 2.0), 1.0, "saturated");
    }

    #[test]
    fn the_fewest_servers_for_a_wait_shrink_as_the_wait_allowed_grows() {
        // 4.2 jobs/s of 0.5 s: 2.1 Erlangs.
        let strict = servers_for_p95(4.2, 0.5, 0.0).expect("servers");
        let loose = servers_for_p95(4.2, 0.5, 5.0).expect("servers");
        assert!(strict >= loose && loose >= 3, "{strict} {loose}");
        // With no wait allowed, 95 % must find a free server.
        assert!(wait_probability(strict, 2.1) <= 0.05);
        assert!(wait_probability(strict - 1, 2.1) > 0.05);
        assert_eq!(servers_for_p95(0.0, 0.5, 1.0), None);
    }
}
