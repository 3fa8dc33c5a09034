//! Metric definitions as data: what the worker and the operator register
//! is built from these, and `docs/metrics.md` is rendered from the same
//! tables, so the reference cannot disagree with what `/metrics` serves.

use prometheus::{
    CounterVec, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts,
};

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (and back to 0 when the process restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets, with `_bucket`, `_sum` and `_count` series.
    Histogram,
}

impl Kind {
    /// The name Prometheus gives the type.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A label of a metric and the values it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label {
    /// The label's name.
    pub name: &'static str,
    /// What values it takes, in Markdown (for the reference).
    pub values: &'static str,
}

/// One metric: its name, type, help text and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The full name, as scraped.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// The help text `/metrics` serves.
    pub help: &'static str,
    /// Its labels, in the order the code gives their values.
    pub labels: &'static [Label],
}

impl Metric {
    /// The label names, in order.
    pub fn label_names(&self) -> Vec<&'static str> {
        self.labels.iter().map(|l| l.name).collect()
    }

    fn opts(&self) -> Opts {
        Opts::new(self.name, self.help)
    }

    fn expect(&self, kind: Kind) {
        // A table that says one type while the code builds another would
        // document the wrong type: refused when the metrics are created.
        assert_eq!(self.kind, kind, "{} is a {}", self.name, self.kind.name());
    }

    fn built<T>(&self, made: prometheus::Result<T>) -> T {
        // The tables are constants: a bad name is a bug the first test
        // run shows.
        made.unwrap_or_else(|e| panic!("metric {} is invalid: {e}", self.name))
    }

    /// An integer counter with this metric's labels.
    pub fn int_counter_vec(&self) -> IntCounterVec {
        self.expect(Kind::Counter);
        self.built(IntCounterVec::new(self.opts(), &self.label_names()))
    }

    /// An integer counter; the metric has no labels.
    pub fn int_counter(&self) -> IntCounter {
        self.expect(Kind::Counter);
        assert!(self.labels.is_empty(), "{} has labels", self.name);
        self.built(IntCounter::with_opts(self.opts()))
    }

    /// A float counter with this metric's labels.
    pub fn counter_vec(&self) -> CounterVec {
        self.expect(Kind::Counter);
        self.built(CounterVec::new(self.opts(), &self.label_names()))
    }

    /// An integer gauge with this metric's labels.
    pub fn int_gauge_vec(&self) -> IntGaugeVec {
        self.expect(Kind::Gauge);
        self.built(IntGaugeVec::new(self.opts(), &self.label_names()))
    }

    /// A float gauge with this metric's labels.
    pub fn gauge_vec(&self) -> GaugeVec {
        self.expect(Kind::Gauge);
        self.built(GaugeVec::new(self.opts(), &self.label_names()))
    }

    /// A histogram with these buckets and this metric's labels.
    pub fn histogram_vec(&self, buckets: Vec<f64>) -> HistogramVec {
        self.expect(Kind::Histogram);
        let opts = HistogramOpts::new(self.name, self.help).buckets(buckets);
        self.built(HistogramVec::new(opts, &self.label_names()))
    }

    /// A histogram with these buckets; the metric has no labels.
    pub fn histogram(&self, buckets: Vec<f64>) -> Histogram {
        self.expect(Kind::Histogram);
        assert!(self.labels.is_empty(), "{} has labels", self.name);
        let opts = HistogramOpts::new(self.name, self.help).buckets(buckets);
        self.built(Histogram::with_opts(opts))
    }
}

/// One process's metrics in the reference: a heading, a paragraph saying
/// where they are scraped, and the table.
#[derive(Debug, Clone, Copy)]
pub struct Section {
    /// The heading.
    pub title: &'static str,
    /// The paragraph under it, in Markdown.
    pub intro: &'static str,
    /// Its metrics, in the order the table lists them.
    pub metrics: &'static [Metric],
}

/// The command that regenerates `docs/metrics.md`.
pub const REGENERATE: &str = "UPDATE_MANIFESTS=1 cargo test -p workerpool-tests --test monitoring";

/// `docs/metrics.md`: every section's metrics, one row each.
pub fn reference(sections: &[Section]) -> String {
    let mut out = String::from("# Metrics\n\n");
    out.push_str(&format!(
        "<!-- Generated from the code (the worker's and the operator's metric tables); do not edit. Regenerate with `{REGENERATE}`. -->\n\n"
    ));
    out.push_str(
        "Every metric the worker and the operator export, with its type, its help text as \
         `/metrics` serves it, and its labels with the values they take. What a metric means \
         for alerts is in the [chart's README](../charts/workerpool-operator/README.md#alerts).\n",
    );
    for section in sections {
        out.push_str(&format!("\n## {}\n\n{}\n\n", section.title, section.intro));
        out.push_str("| Metric | Type | Help | Labels |\n|---|---|---|---|\n");
        for m in section.metrics {
            let labels = if m.labels.is_empty() {
                "none".to_string()
            } else {
                m.labels
                    .iter()
                    .map(|l| format!("`{}`: {}", l.name, l.values))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                m.name,
                m.kind.name(),
                cell(m.help),
                cell(&labels)
            ));
        }
    }
    out
}

/// Text fit for a table cell: a `|` would end the cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABELLED: Metric = Metric {
        name: "t_total",
        kind: Kind::Counter,
        help: "Things | counted",
        labels: &[Label {
            name: "what",
            values: "`a` or `b`",
        }],
    };

    #[test]
    fn a_metric_renders_as_one_row_with_its_type_help_and_label_values() {
        let doc = reference(&[Section {
            title: "T",
            intro: "Scraped somewhere.",
            metrics: &[LABELLED],
        }]);
        assert!(
            doc.contains("| `t_total` | counter | Things \\| counted | `what`: `a` or `b` |\n"),
            "{doc}"
        );
        assert!(doc.contains(REGENERATE), "{doc}");
    }

    #[test]
    #[should_panic(expected = "t_total is a counter")]
    fn building_a_metric_as_another_type_than_its_table_says_is_refused() {
        let _ = LABELLED.int_gauge_vec();
    }
}
