//! `--png`: bandwidth (GB/s) and p50/p99 latency (µs) against message size, side by side,
//! drawn with plotters' bitmap backend. Text needs a TrueType font, loaded from `IBNET_FONT`
//! or the usual system paths (Debian/Ubuntu: package `fonts-dejavu-core`); no fontconfig.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::sweep::Row;
use crate::{fmt_bytes, Error};

/// Font files tried in order after `IBNET_FONT`.
pub const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn register_font() -> Result<(), Error> {
    static DONE: std::sync::OnceLock<Result<(), Error>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let cands: Vec<String> = ibnet_nccl::env::var("IBNET_FONT")
            .into_iter()
            .chain(FONT_PATHS.iter().map(|s| s.to_string()))
            .collect();
        for p in &cands {
            if let Ok(bytes) = std::fs::read(p) {
                // The font lives for the process (plotters wants 'static bytes).
                let b: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, b).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(Error(format!(
            "--png needs a TrueType font: install fonts-dejavu-core or set IBNET_FONT (tried {})",
            cands.join(", ")
        )))
    })
    .clone()
}

fn e<E: std::fmt::Display>(x: E) -> Error {
    Error(format!("plot: {x}"))
}

/// Writes the PNG to `path`.
pub fn png(path: &std::path::Path, title: &str, rows: &[Row]) -> Result<(), Error> {
    register_font()?;
    if rows.is_empty() {
        return Err(Error("plot: no results".into()));
    }
    let root = BitMapBackend::new(path, (1400, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let (top, body) = root.split_vertically(40);
    top.titled(title, ("sans-serif", 18)).map_err(e)?;
    let (l, r) = body.split_horizontally(700);
    let xs: Vec<f64> = rows.iter().map(|r| (r.size as f64).log2()).collect();
    bandwidth(&l, &xs, rows)?;
    latency(&r, &xs, rows)?;
    root.present().map_err(e)?;
    Ok(())
}

/// The x axis of both charts: log2 of the message sizes `xs` (at least one unit wide).
fn x_range(xs: &[f64]) -> std::ops::Range<f64> {
    xs[0]..xs[xs.len() - 1].max(xs[0] + 1.0)
}

/// An x label: the message size of a log2 value.
fn xfmt(v: &f64) -> String {
    fmt_bytes(2f64.powf(v.round()) as u64)
}

/// The bandwidth chart (GB/s against `xs`, the rows' log2 sizes) into `area`.
fn bandwidth(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    xs: &[f64],
    rows: &[Row],
) -> Result<(), Error> {
    let bw_max = rows.iter().map(|r| r.bw_gbps).fold(0.0, f64::max).max(1e-3) * 1.1;
    let mut c = ChartBuilder::on(area)
        .caption("bandwidth", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range(xs), 0.0..bw_max)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc("message size")
        .y_desc("GB/s")
        .x_label_formatter(&xfmt)
        .draw()
        .map_err(e)?;
    let pts: Vec<(f64, f64)> = xs.iter().zip(rows).map(|(x, r)| (*x, r.bw_gbps)).collect();
    c.draw_series(LineSeries::new(pts.clone(), BLUE.stroke_width(2)))
        .map_err(e)?;
    c.draw_series(pts.iter().map(|p| Circle::new(*p, 3, BLUE.filled())))
        .map_err(e)?;
    Ok(())
}

/// The p50/p99 latency chart (µs, log scale, against `xs`) into `area`.
fn latency(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    xs: &[f64],
    rows: &[Row],
) -> Result<(), Error> {
    let lat: Vec<(f64, f64, f64)> = xs
        .iter()
        .zip(rows)
        .filter(|(_, r)| r.lat_p50_us.is_finite() && r.lat_p99_us.is_finite())
        .map(|(x, r)| {
            (
                *x,
                r.lat_p50_us.max(1e-3).log10(),
                r.lat_p99_us.max(1e-3).log10(),
            )
        })
        .collect();
    let lo = lat
        .iter()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        .min(0.0)
        .floor();
    let hi = lat
        .iter()
        .map(|p| p.2)
        .fold(f64::NEG_INFINITY, f64::max)
        .max(lo + 1.0)
        .ceil();
    let mut c = ChartBuilder::on(area)
        .caption("one-way latency", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range(xs), lo..hi)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc("message size")
        .y_desc("µs (log)")
        .x_label_formatter(&xfmt)
        .y_labels((hi - lo) as usize + 1)
        .y_label_formatter(&|v: &f64| {
            if (v - v.round()).abs() < 1e-6 {
                format!("{}", 10f64.powi(v.round() as i32))
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(e)?;
    c.draw_series(LineSeries::new(
        lat.iter().map(|p| (p.0, p.1)),
        GREEN.stroke_width(2),
    ))
    .map_err(e)?
    .label("p50")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
    c.draw_series(LineSeries::new(
        lat.iter().map(|p| (p.0, p.2)),
        RED.stroke_width(2),
    ))
    .map_err(e)?
    .label("p99")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(e)?;
    Ok(())
}
