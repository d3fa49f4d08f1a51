//! Output formats: a table for people, JSON and CSV for scripts.

use serde::Serialize;

use crate::sweep::Row;
use crate::{fmt_bytes, Error};

/// What was measured (the header line, and the `meta` object of `--json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Meta {
    /// Plugin file.
    pub plugin_path: String,
    /// Plugin table name.
    pub plugin_name: String,
    /// ABI symbol used.
    pub abi: String,
    /// Device index and name.
    pub device: String,
    /// Port speed, Mbps.
    pub speed_mbps: i32,
    /// Provider note (ibnet only), e.g. "soft (set by ibnet-perf: no RDMA NIC)".
    pub provider: Option<String>,
    /// "loopback" or "client HOST:PORT".
    pub mode: String,
    /// Window.
    pub window: usize,
    /// Receives per request.
    pub multirecv: usize,
    /// Verification on.
    pub check: bool,
}

impl Meta {
    /// A short title (plots).
    pub fn title(&self) -> String {
        let prov = self
            .provider
            .as_deref()
            .and_then(|p| p.split_whitespace().next())
            .map(|p| format!(", provider {p}"))
            .unwrap_or_default();
        format!(
            "ibnet-perf: {} on {}{prov}, {}, window {}, multirecv {}",
            self.plugin_name,
            self.device,
            self.mode.split(" (").next().unwrap_or(""),
            self.window,
            self.multirecv
        )
    }

    /// The one-line header.
    pub fn header(&self) -> String {
        let prov = self
            .provider
            .as_deref()
            .map(|p| format!(", provider {p}"))
            .unwrap_or_default();
        format!(
            "ibnet-perf: {} ({}) {} | device {} ({} Gb/s){prov} | {} | window {}, multirecv {}, check {}",
            self.plugin_name,
            self.abi,
            self.plugin_path,
            self.device,
            self.speed_mbps / 1000,
            self.mode,
            self.window,
            self.multirecv,
            if self.check { "on" } else { "off" }
        )
    }
}

fn f(v: f64, prec: usize) -> String {
    if v.is_finite() {
        format!("{v:.prec$}")
    } else {
        "-".into()
    }
}

/// The human table.
pub fn table(rows: &[Row]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "size",
        "lat p50 µs",
        "lat p99 µs",
        "BW GB/s",
        "Mmsg/s",
        "iters lat/bw",
        "win",
        "check",
    ]);
    for r in rows {
        t.add_row(vec![
            fmt_bytes(r.size as u64),
            f(r.lat_p50_us, 2),
            f(r.lat_p99_us, 2),
            f(r.bw_gbps, 3),
            f(r.msg_rate_mps, 3),
            format!("{}/{}", r.lat_iters, r.bw_iters),
            r.window.to_string(),
            r.check.clone(),
        ]);
    }
    for i in 1..=5 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    t.to_string()
}

#[derive(Serialize)]
struct JsonOut<'a> {
    meta: &'a Meta,
    results: &'a [Row],
}

/// `--json`: `{"meta": {...}, "results": [rows]}` (NaN latencies become null).
pub fn json(meta: &Meta, rows: &[Row]) -> Result<String, Error> {
    Ok(serde_json::to_string_pretty(&JsonOut {
        meta,
        results: rows,
    })?)
}

/// `--csv`: one header line and one line per size.
pub fn csv(rows: &[Row]) -> Result<String, Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r).map_err(|e| Error(e.to_string()))?;
    }
    let bytes = w.into_inner().map_err(|e| Error(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| Error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Row> {
        vec![
            Row {
                size: 8,
                lat_p50_us: 1.5,
                lat_p99_us: 3.25,
                lat_mean_us: 1.75,
                lat_iters: 1000,
                bw_gbps: 0.012,
                msg_rate_mps: 1.5,
                bw_iters: 1000,
                window: 16,
                multirecv: 1,
                check: "ok".into(),
            },
            Row {
                size: 1 << 20,
                lat_p50_us: f64::NAN,
                lat_p99_us: f64::NAN,
                lat_mean_us: f64::NAN,
                lat_iters: 0,
                bw_gbps: 9.5,
                msg_rate_mps: 0.009,
                bw_iters: 1000,
                window: 16,
                multirecv: 1,
                check: "-".into(),
            },
        ]
    }

    fn meta() -> Meta {
        Meta {
            plugin_path: "/x/libnccl-net-ibnet.so".into(),
            plugin_name: "IBNet".into(),
            abi: "ncclNetPlugin_v11".into(),
            device: "0 soft0".into(),
            speed_mbps: 100_000,
            provider: Some("soft".into()),
            mode: "loopback".into(),
            window: 16,
            multirecv: 1,
            check: true,
        }
    }

    #[test]
    fn table_has_rows_and_units() {
        let t = table(&rows());
        assert!(t.contains("lat p50 µs") && t.contains("BW GB/s"), "{t}");
        assert!(
            t.contains("8B") && t.contains("1MiB") && t.contains("1.50") && t.contains("9.500"),
            "{t}"
        );
        assert!(t.contains("1000/1000") && t.contains(" ok"), "{t}");
    }

    #[test]
    fn json_roundtrips_rows() {
        let j = json(&meta(), &rows()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["meta"]["plugin_name"], "IBNet");
        assert_eq!(v["results"][0]["size"], 8);
        assert_eq!(v["results"][0]["lat_p99_us"], 3.25);
        assert!(v["results"][1]["lat_p50_us"].is_null());
        assert_eq!(v["results"][1]["bw_gbps"], 9.5);
    }

    #[test]
    fn csv_columns() {
        let c = csv(&rows()).unwrap();
        let mut lines = c.lines();
        assert_eq!(
            lines.next().unwrap(),
            "size,lat_p50_us,lat_p99_us,lat_mean_us,lat_iters,bw_gbps,msg_rate_mps,bw_iters,window,multirecv,check"
        );
        assert_eq!(
            lines.next().unwrap(),
            "8,1.5,3.25,1.75,1000,0.012,1.5,1000,16,1,ok"
        );
        assert_eq!(lines.count(), 1);
    }

    #[test]
    fn header_says_provider() {
        let h = meta().header();
        assert!(
            h.contains("provider soft") && h.contains("loopback") && h.contains("100 Gb/s"),
            "{h}"
        );
    }
}
