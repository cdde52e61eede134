//! The report's figure (SVG, drawn with plotters): per-step iteration time of every run on
//! top, and bars of the main columns below, one colour per recipe throughout, so the
//! comparison reads without reading numbers. No Burn here.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{Row, Run};

const W: u32 = 1200;
const H: u32 = 820;

fn colour(i: usize) -> RGBColor {
    // Okabe–Ito: distinguishable with the common colour-vision deficiencies.
    const C: [(u8, u8, u8); 8] = [
        (0, 114, 178),
        (230, 159, 0),
        (0, 158, 115),
        (204, 121, 167),
        (86, 180, 233),
        (213, 94, 0),
        (240, 228, 66),
        (0, 0, 0),
    ];
    let (r, g, b) = C[i % C.len()];
    RGBColor(r, g, b)
}

/// Draws the figure to `path` (SVG).
pub fn draw(path: &Path, runs: &[Run], rows: &[Row]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    // Drawn beside it and renamed: a failed drawing leaves an earlier plot whole.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let drawn = (|| {
        let root = SVGBackend::new(&tmp, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let (top, bottom) = root.split_vertically(440);
        step_times(&top, runs, rows, &err)?;
        bars(&bottom, rows, &err)?;
        root.present().map_err(|e| err(&e))
    })();
    match drawn.and_then(|()| std::fs::rename(&tmp, path).map_err(|e| err(&e))) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Whether `path` may receive the plot: an `.svg` name, and not a file other than an SVG
/// (`--plot runs/x/metrics.jsonl` would replace a run's records).
pub fn check_target(path: &Path) -> Result<(), String> {
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if !svg {
        return Err("the plot is an SVG file: give a name ending in .svg".into());
    }
    if path.is_dir() {
        return Err("is a directory: give a file name ending in .svg".into());
    }
    // Found here, before the table is printed, not when drawing after it.
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !folder.is_dir() {
        let why = match crate::recipe::odd_kind(folder) {
            Some(kind) => format!("is {kind}, not a folder"),
            None if folder.exists() => "is a file, not a folder".into(),
            None => crate::recipe::why_missing(folder),
        };
        return Err(format!("its folder {} {why}", folder.display()));
    }
    if let Ok(mut f) = std::fs::File::open(path) {
        use std::io::Read;
        let mut head = [0u8; 256];
        let n = f.read(&mut head).unwrap_or(0);
        let text = String::from_utf8_lossy(&head[..n]);
        let text = text.trim_start();
        if n > 0 && !(text.starts_with("<svg") || text.starts_with("<?xml")) {
            return Err("exists and is not an SVG file: not overwritten (remove it, or choose another name)".into());
        }
    }
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Err<'e> = &'e dyn Fn(&dyn std::fmt::Display) -> String;

/// The top panel: every run's step times, one colour per recipe.
fn step_times(top: &Area, runs: &[Run], rows: &[Row], err: Err) -> Result<(), String> {
    let index = |name: &str| rows.iter().position(|r| r.recipe == name).unwrap_or(0);
    // Per-step time, clipped above at 1.5 × the largest p95 so one slow first step (autotune,
    // allocation) does not flatten the rest.
    let steps = runs
        .iter()
        .map(|r| r.records.len())
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    let ymax = runs
        .iter()
        .map(|r| r.summary.iter_ms.p95)
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.5;
    let mut chart = ChartBuilder::on(top)
        .caption("time per optimizer step (ms)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..steps, 0f64..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("optimizer step")
        .y_desc("ms")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| err(&e))?;
    let mut labelled = vec![];
    for run in runs {
        let i = index(&run.name);
        let c = colour(i);
        let points = run
            .records
            .iter()
            .map(|r| (r.step as f64, r.iter_ms.min(ymax)));
        let series = chart
            .draw_series(LineSeries::new(points, c.stroke_width(1)))
            .map_err(|e| err(&e))?;
        if !labelled.contains(&i) {
            labelled.push(i);
            series.label(run.name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3))
            });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

/// The bottom panels: one per column of the table, one bar per recipe.
fn bars(bottom: &Area, rows: &[Row], err: Err) -> Result<(), String> {
    let util: Vec<f64> = rows
        .iter()
        .map(|r| r.gpu_util_pct.or(r.cpu_util_pct).unwrap_or(f64::NAN))
        .collect();
    let util_title = if rows.iter().any(|r| r.gpu_util_pct.is_some()) {
        "GPU utilisation (%)"
    } else {
        "CPU utilisation (%)"
    };
    let mem: Vec<f64> = rows
        .iter()
        .map(|r| {
            r.peak_in_use_bytes
                .or(r.peak_rss_bytes)
                .map_or(f64::NAN, |b| b as f64 / (1u64 << 30) as f64)
        })
        .collect();
    let mem_title = if rows.iter().any(|r| r.peak_in_use_bytes.is_some()) {
        "peak device memory in use (GiB)"
    } else {
        "peak resident memory (GiB)"
    };
    let panels: [(&str, Vec<f64>); 4] = [
        ("median ms/iter", rows.iter().map(|r| r.ms_median).collect()),
        (util_title, util),
        (mem_title, mem),
        (
            "cleanup + data wait (% of step)",
            rows.iter()
                .map(|r| r.cleanup_pct + r.data_wait_pct)
                .collect(),
        ),
    ];
    let areas = bottom.split_evenly((1, panels.len()));
    for (area, (title, values)) in areas.iter().zip(panels) {
        let top_v = values.iter().cloned().fold(0.0, f64::max).max(1e-9) * 1.15;
        let n = rows.len() as f64;
        let mut c = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..n, 0f64..top_v)
            .map_err(|e| err(&e))?;
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| err(&e))?;
        // A recipe with no timed step (or no reading) has no bar, and `-` for its value.
        c.draw_series(
            values
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, v)| {
                    let x = i as f64;
                    Rectangle::new([(x + 0.15, 0.0), (x + 0.85, *v)], colour(i).filled())
                }),
        )
        .map_err(|e| err(&e))?;
        c.draw_series(values.iter().enumerate().map(|(i, v)| {
            let (label, y) = if v.is_finite() {
                (format!("{v:.1}"), *v)
            } else {
                ("-".to_string(), 0.0)
            };
            Text::new(
                label,
                (i as f64 + 0.2, y + top_v * 0.035),
                ("sans-serif", 13),
            )
        }))
        .map_err(|e| err(&e))?;
    }
    Ok(())
}
