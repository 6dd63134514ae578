//! The output of `cargo xtask bench`: `report.json` (everything, raw runs
//! included), `report.md` (the table), `ratios.svg` and `latency.svg`, and
//! the table printed to the terminal.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::{Value, json};

use super::quiet::Load;

/// One measured figure next to the limit that bounds it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) suite: String,
    pub(crate) name: String,
    pub(crate) measured: f64,
    pub(crate) unit: String,
    /// What bounds the figure, and how the bound follows from the limit.
    pub(crate) limit_name: String,
    /// The physical limit, measured in the same run.
    pub(crate) limit: f64,
    pub(crate) limit_unit: String,
    /// The limit expressed in `unit` (e.g. tok/s from GB/s and bytes/token).
    pub(crate) bound: f64,
    /// `measured / bound` for rates, `bound / measured` for times: 1.0 is the
    /// physical limit either way.
    pub(crate) ratio: f64,
    pub(crate) goal: Option<f64>,
    pub(crate) note: String,
    /// Every run's figure behind `measured` (empty where the row is one run
    /// or not made of runs).
    pub(crate) runs: Vec<f64>,
    /// Every run's figure behind `bound`, where the bound is measured run by
    /// run (a peer engine).
    pub(crate) bound_runs: Vec<f64>,
    /// The worst load the rest of the machine put on the row's runs
    /// (`Report::push` fills it from the runs recorded since the last row).
    pub(crate) load: Option<Load>,
}

impl Row {
    /// Whether the row may be compared with its goal: not when any of its
    /// runs shared the machine with other work.
    fn is_loaded(&self) -> bool {
        self.load.is_some_and(|l| !l.is_quiet())
    }

    fn verdict(&self) -> &'static str {
        match self.goal {
            Some(_) if self.is_loaded() => "loaded: not compared",
            Some(goal) if self.ratio >= goal => "met",
            Some(_) => "not met",
            None => "",
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "suite": self.suite, "name": self.name, "measured": self.measured, "unit": self.unit,
            "limit_name": self.limit_name, "limit": self.limit, "limit_unit": self.limit_unit,
            "bound": self.bound, "ratio": self.ratio, "goal": self.goal, "verdict": self.verdict(),
            "note": self.note, "runs": self.runs, "bound_runs": self.bound_runs,
            "others_cpu_cores": self.load.map(|l| l.others_cores),
            "loadavg_1m": self.load.map(|l| l.loadavg_1m),
            "quiet": self.load.map(|l| l.is_quiet()),
        })
    }
}

#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) machine: Value,
    /// The limits themselves (DRAM read, FMA peak).
    pub(crate) limits: Vec<Value>,
    pub(crate) rows: Vec<Row>,
    /// Every probe and generate result, for re-analysis.
    pub(crate) raw: Vec<Value>,
    pub(crate) notes: Vec<String>,
    /// Per-token decode latency of one streaming run per I/O backend.
    pub(crate) curves: Vec<(String, Vec<f64>)>,
    pub(crate) elapsed_s: f64,
}

impl Report {
    pub(crate) fn new(machine: Value) -> Self {
        Report {
            machine,
            limits: Vec::new(),
            rows: Vec::new(),
            raw: Vec::new(),
            notes: Vec::new(),
            curves: Vec::new(),
            elapsed_s: 0.0,
        }
    }

    /// Adds a row, with the loads of the runs recorded since the previous
    /// row (`bench_quiet::measured`); a row pushed with no new runs shares
    /// the previous row's runs, and so its load.
    pub(crate) fn push(&mut self, mut row: Row) {
        let recorded = super::quiet::take_recorded();
        row.load = Load::worst(&recorded).or_else(|| self.rows.last().and_then(|r| r.load));
        self.rows.push(row);
    }

    pub(crate) fn write(&self, out: &Path) -> Result<()> {
        let json = json!({
            "machine": self.machine,
            "elapsed_s": self.elapsed_s,
            "limits": self.limits,
            "rows": self.rows.iter().map(Row::to_json).collect::<Vec<_>>(),
            "notes": self.notes,
            "raw": self.raw,
        });
        let write = |name: &str, text: String| {
            let path = out.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
        };
        write("report.json", serde_json::to_string_pretty(&json)?)?;
        write("report.md", self.markdown())?;
        if !self.rows.is_empty() {
            self.plot_ratios(&out.join("ratios.svg"))?;
        }
        if !self.curves.is_empty() {
            self.plot_latency(&out.join("latency.svg"))?;
        }
        Ok(())
    }

    fn markdown(&self) -> String {
        let m = &self.machine;
        let mut s = String::new();
        let _ = writeln!(s, "# cargo xtask bench — {}\n", m["date"].as_str().unwrap_or(""));
        let _ = writeln!(
            s,
            "Machine: {}, {} cores, {} RAM; load average at start {}. Suite took {:.0} s.\n",
            m["cpu"].as_str().unwrap_or("?"),
            m["cores"],
            m["mem_total"].as_str().unwrap_or("?"),
            m["loadavg_at_start"].as_str().unwrap_or("?"),
            self.elapsed_s
        );
        if !self.limits.is_empty() {
            let _ = writeln!(s, "| limit (measured in this run) | value |\n|---|---|");
            for l in &self.limits {
                let _ = writeln!(
                    s,
                    "| {} | {:.1} {} |",
                    l["what"].as_str().unwrap_or(""),
                    l["value"].as_f64().unwrap_or(f64::NAN),
                    l["unit"].as_str().unwrap_or("")
                );
            }
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "| figure | measured | bound (limit) | ratio | goal | runs: min / median / max | machine |\n\
             |---|---|---|---|---|---|---|"
        );
        for r in &self.rows {
            let goal = r.goal.map(|g| format!("≥ {g} {}", r.verdict())).unwrap_or_default();
            let _ = writeln!(
                s,
                "| {} | {} {} | {} {} ({}: {:.2} {}) | **{:.2}** | {} | {} | {} |",
                r.name,
                fmt_value(r.measured),
                r.unit,
                fmt_value(r.bound),
                r.unit,
                r.limit_name,
                r.limit,
                r.limit_unit,
                r.ratio,
                goal,
                spread(&r.runs, &r.bound_runs),
                machine(r.load)
            );
        }
        for n in &self.notes {
            let _ = writeln!(s, "\n{n}");
        }
        s
    }

    /// The table for the terminal.
    pub(crate) fn table(&self) -> String {
        let mut s = String::new();
        for l in &self.limits {
            let _ = writeln!(
                s,
                "limit  {:<42} {:>9.1} {}",
                l["what"].as_str().unwrap_or(""),
                l["value"].as_f64().unwrap_or(f64::NAN),
                l["unit"].as_str().unwrap_or("")
            );
        }
        let _ = writeln!(s, "\n{:<78} {:>10} {:>10} {:>6}  goal", "figure", "measured", "bound", "ratio");
        for r in &self.rows {
            let goal = r.goal.map(|g| format!(">= {g} {}", r.verdict())).unwrap_or_default();
            let _ = writeln!(
                s,
                "{:<78} {:>10} {:>10} {:>6.2}  {}",
                format!("{} [{}]", r.name, r.unit),
                fmt_value(r.measured),
                fmt_value(r.bound),
                r.ratio,
                goal
            );
        }
        s
    }

    /// Horizontal bars: each row's ratio, with its goal marked.
    fn plot_ratios(&self, path: &Path) -> Result<()> {
        let n = self.rows.len();
        let height = 80 + 26 * n as u32;
        let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let max = self.rows.iter().map(|r| r.ratio).filter(|r| r.is_finite()).fold(1.0f64, f64::max) * 1.05;
        // Each bar is labelled with its row's name and ratio, right of the
        // bar; the axis on the left stays empty.
        let mut chart = ChartBuilder::on(&root)
            .caption("measured / physical limit (same run); black ticks: goals", ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(10)
            .build_cartesian_2d(0.0..max * 1.9, -0.5..(n as f64 - 0.5))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_desc("ratio (1.0 = the limit)")
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(self.rows.iter().enumerate().map(|(i, r)| {
                let at = (r.ratio.max(0.0) + 0.02, n as f64 - 1.0 - i as f64 + 0.25);
                Text::new(format!("{:.2}  {}", r.ratio, r.name), at, ("sans-serif", 12))
            }))
            .map_err(plot_err)?;
        chart
            .draw_series(self.rows.iter().enumerate().map(|(i, r)| {
                // First row on top.
                let y = n as f64 - 1.0 - i as f64;
                let color = match r.goal {
                    _ if r.is_loaded() => BLACK.mix(0.25),
                    Some(g) if r.ratio >= g => GREEN.mix(0.7),
                    Some(_) => RED.mix(0.6),
                    None => BLUE.mix(0.5),
                };
                Rectangle::new([(0.0, y - 0.35), (r.ratio.max(0.0), y + 0.35)], color.filled())
            }))
            .map_err(plot_err)?;
        chart
            .draw_series(self.rows.iter().enumerate().filter_map(|(i, r)| {
                let y = n as f64 - 1.0 - i as f64;
                r.goal.map(|g| PathElement::new(vec![(g, y - 0.45), (g, y + 0.45)], BLACK.stroke_width(2)))
            }))
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
        Ok(())
    }

    /// Decode latency per token of one cold streaming run per backend.
    fn plot_latency(&self, path: &Path) -> Result<()> {
        let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let steps = self.curves.iter().map(|(_, c)| c.len()).max().unwrap_or(1).max(2);
        let top = self.curves.iter().flat_map(|(_, c)| c.iter().copied()).fold(1.0f64, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption("streaming decode latency per token (cold start)", ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0usize..steps, 0.0..top)
            .map_err(plot_err)?;
        chart.configure_mesh().x_desc("decode step").y_desc("ms").draw().map_err(plot_err)?;
        for (k, (label, curve)) in self.curves.iter().enumerate() {
            let color = Palette99::pick(k).to_rgba();
            chart
                .draw_series(LineSeries::new(curve.iter().enumerate().map(|(i, &v)| (i, v)), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
        Ok(())
    }
}

/// `min / median / max` of the runs (and of the bound's, where measured run
/// by run), each run's figure being in report.json.
fn spread(runs: &[f64], bound_runs: &[f64]) -> String {
    let one = |v: &[f64]| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{} / {} / {}", fmt_value(min), fmt_value(super::stats::median(v)), fmt_value(max))
    };
    match (runs.is_empty(), bound_runs.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!("{} ({} runs)", one(runs), runs.len()),
        (false, false) => format!("{} (bound: {}; {} runs)", one(runs), one(bound_runs), runs.len()),
    }
}

/// How quiet the machine was during the row's runs.
fn machine(load: Option<Load>) -> String {
    match load {
        None => String::new(),
        Some(l) if l.is_quiet() => format!("quiet ({:.2} cores others)", l.others_cores),
        Some(l) => format!("**LOADED** ({:.2} cores others, load {:.1})", l.others_cores, l.loadavg_1m),
    }
}

fn plot_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing a plot: {e}")
}

/// Three significant digits, without scientific notation for usual sizes.
fn fmt_value(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn peer_row(goal: Option<f64>) -> Row {
        Row {
            suite: "peer".into(),
            runs: vec![80.0, 82.0, 79.0],
            bound_runs: vec![16.0, 15.0, 15.5],
            load: None,
            name: "resident decode".into(),
            measured: 80.0,
            unit: "tok/s".into(),
            limit_name: "llama.cpp".into(),
            limit: 15.5,
            limit_unit: "tok/s".into(),
            bound: 15.5,
            ratio: 80.0 / 15.5,
            goal,
            note: String::new(),
        }
    }

    #[test]
    fn a_row_measured_beside_a_busy_process_is_marked_loaded_and_compared_with_no_goal() {
        // An unknown process (not a `BusyCore` the bench started) spins while
        // the row's run is measured.
        let mut spinner = std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let measured = crate::bench::quiet::measured_within(Duration::ZERO, || {
            std::thread::sleep(Duration::from_millis(1500));
            Ok(())
        });
        let _ = spinner.kill();
        let _ = spinner.wait();
        measured.unwrap();
        let mut report = Report::new(json!({}));
        report.push(peer_row(Some(1.0)));
        // A second row over the same runs shares their load.
        report.push(peer_row(Some(1.0)));
        for row in &report.rows {
            assert!(row.is_loaded(), "{:?}", row.load);
            assert_eq!(row.verdict(), "loaded: not compared");
        }
        let table = report.markdown();
        assert!(table.contains("**LOADED**"), "{table}");
        assert!(!table.contains(" met |"), "{table}");
        assert!(table.contains("79.0 / 80.0 / 82.0"), "{table}");
    }

    #[test]
    fn a_row_from_quiet_runs_is_compared_with_its_goal() {
        let mut row = peer_row(Some(1.0));
        row.load = Some(Load { others_cores: 0.01, loadavg_1m: 0.05 });
        assert_eq!(row.verdict(), "met");
        row.ratio = 0.8;
        assert_eq!(row.verdict(), "not met");
    }
}
