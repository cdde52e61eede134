//! The report's figure (SVG, drawn with plotters): per-step iteration time of every run on
//! top, bars of the main columns below, and a key: one colour (and number) per row of the
//! table throughout, so the comparison reads without reading numbers. No Burn here.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{Row, Run};

const W: u32 = 1200;
/// The two panels' height; the key below them grows with the rows.
const H: u32 = 820;
/// A line of the key.
const KEY_LINE: u32 = 20;

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

/// Rows past the palette's eight repeat its colours, each further eight with lines of
/// another dash pattern (dash, gap in pixels; bars are told apart by their number, the
/// key's). Past 32 rows the patterns repeat too.
fn dashes(i: usize) -> Option<(u32, u32)> {
    const PATTERNS: [(u32, u32); 3] = [(6, 4), (2, 3), (12, 4)];
    match i / 8 {
        0 => None,
        k => Some(PATTERNS[(k - 1) % PATTERNS.len()]),
    }
}

/// Draws the figure to `path` (SVG).
pub fn draw(path: &Path, runs: &[Run], rows: &[Row]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    // Drawn beside it and renamed: a failed drawing leaves an earlier plot whole.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    // Drawn in memory, then written to a new file (never through a link left at the
    // temporary name), marked as runner's so that a later plot may replace it.
    let mut svg = String::new();
    let drawn = (|| {
        let key_h = 24 + KEY_LINE * rows.len() as u32;
        let root = SVGBackend::with_string(&mut svg, (W, H + key_h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let (top, rest) = root.split_vertically(440);
        let (bottom, below) = rest.split_vertically(H - 440);
        step_times(&top, runs, rows, &err)?;
        bars(&bottom, rows, &err)?;
        key(&below, rows, &err)?;
        root.present().map_err(|e| err(&e))
    })();
    let written = drawn.and_then(|()| {
        let text = format!("{MARK}\n{svg}");
        crate::metrics::write_new(&tmp, text.as_bytes())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| err(&e))
    });
    match written {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The first line of a plot runner drew: only a file that starts with it is replaced.
const MARK: &str = "<!-- runner report --plot -->";

/// Whether `path` may receive the plot: an `.svg` name, and nothing there but an earlier
/// plot of runner's (`--plot runs/x/metrics.jsonl` would replace a run's records, and any
/// SVG was replaced: a hand-drawn logo), nor a pipe or a device (a pipe hung the write).
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
    if let Some(kind) = crate::recipe::odd_kind(path) {
        return Err(format!(
            "is {kind}, not a file: give a file name ending in .svg"
        ));
    }
    // A folder no file can be made in (`/proc`, a read-only mount, another user's):
    // found before the table, with what to do (it failed after it, saying "No such file").
    if let Err(e) = crate::metrics::takes_new_file(folder) {
        return Err(format!(
            "no file can be made in its folder {} ({e}): give a path in a folder this user can write",
            folder.display()
        ));
    }
    if let Ok(mut f) = std::fs::File::open(path) {
        use std::io::Read;
        let mut head = [0u8; MARK.len()];
        let n = f.read(&mut head).unwrap_or(0);
        if n > 0 && &head[..n] != MARK.as_bytes() {
            return Err("exists and is not a plot runner drew: not overwritten (remove it, or choose another name)".into());
        }
    }
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Err<'e> = &'e dyn Fn(&dyn std::fmt::Display) -> String;

/// The top panel: every run's step times, in its row's colour.
fn step_times(top: &Area, runs: &[Run], rows: &[Row], err: Err) -> Result<(), String> {
    // Each run's row: the table's label of it (a recipe's runs that ran different settings,
    // devices or thread counts are rows of their own).
    let label = crate::report::labels(runs);
    let index = |l: &str| rows.iter().position(|r| r.recipe == l).unwrap_or(0);
    // Per-step time, clipped above at 1.5 × the largest p95 so one slow first step (autotune,
    // allocation) does not flatten the rest.
    let steps = runs.iter().map(|r| r.trace.steps).max().unwrap_or(1).max(2) as f64;
    // (A run with no timed step, all of it warm-up, has no p95: its slowest step instead.)
    let ymax = runs
        .iter()
        .map(|r| match r.summary.iter_ms.p95 {
            p if p.is_finite() && p > 0.0 => p,
            _ => r.trace.max_ms / 1.5,
        })
        .fold(0.0, f64::max)
        .clamp(1e-3, 1e300)
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
    for (run, l) in runs.iter().zip(&label) {
        let i = index(l);
        let style = colour(i).stroke_width(1);
        let points = run.trace.points().map(|(step, ms)| (step, ms.min(ymax)));
        match dashes(i) {
            Some((dash, gap)) => chart.draw_series(DashedLineSeries::new(points, dash, gap, style)),
            None => chart.draw_series(LineSeries::new(points, style)),
        }
        .map_err(|e| err(&e))?;
    }
    Ok(())
}

/// Below the panels, the rows by number, colour and label, as the table has them.
fn key(area: &Area, rows: &[Row], err: Err) -> Result<(), String> {
    let font = ("sans-serif", 14).into_font();
    for (i, r) in rows.iter().enumerate() {
        let y = 12 + (KEY_LINE as usize * i) as i32;
        let c = colour(i);
        let (x0, x1) = (24, 60);
        let style = c.stroke_width(3);
        match dashes(i) {
            Some((dash, gap)) => area.draw(&plotters::element::DashedPathElement::new(
                vec![(x0, y), (x1, y)],
                dash,
                gap,
                style,
            )),
            None => area.draw(&PathElement::new(vec![(x0, y), (x1, y)], style)),
        }
        .map_err(|e| err(&e))?;
        let mut label: String = r.recipe.chars().take(150).collect();
        if r.recipe.chars().count() > 150 {
            label.push('…');
        }
        area.draw(&Text::new(
            format!("{}  {label}", i + 1),
            (x1 + 10, y - 8),
            font.clone(),
        ))
        .map_err(|e| err(&e))?;
    }
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
        // No row has this figure (no timed step, no utilisation reading): said, not an
        // axis of zeros.
        if !values.iter().any(|v| v.is_finite()) {
            let (w, h) = area.dim_in_pixel();
            area.draw(&Text::new(title, (10, 10), ("sans-serif", 16)))
                .and_then(|()| {
                    area.draw(&Text::new(
                        "no run has this figure",
                        (w as i32 / 2 - 70, h as i32 / 2),
                        ("sans-serif", 13).into_font().color(&BLACK.mix(0.6)),
                    ))
                })
                .map_err(|e| err(&e))?;
            continue;
        }
        // (Bounded: a value near f64's largest made the axis infinite, and plotters then
        // looked for its ticks for good.)
        let top_v = values
            .iter()
            .cloned()
            .fold(0.0, f64::max)
            .clamp(1e-9, 1e300)
            * 1.15;
        let n = rows.len() as f64;
        // Room under the axis for each bar's number (the key's): the values' axis starts
        // below 0, its labels there left out.
        let floor = -top_v * 0.08;
        // The values' labels to the digits their scale needs (the key points are sums of
        // floats: 0.060000000000000005 otherwise).
        let decimals = match top_v {
            v if v >= 10.0 => 0,
            v if v >= 1.0 => 1,
            v if v >= 0.1 => 2,
            _ => 3,
        };
        let mut c = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(10)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..n, floor..top_v)
            .map_err(|e| err(&e))?;
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_label_formatter(&|y| match *y {
                y if y < 0.0 => String::new(),
                y => format!("{y:.*}", decimals),
            })
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| err(&e))?;
        c.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 0.0), (n, 0.0)],
            BLACK.mix(0.4).stroke_width(1),
        )))
        .map_err(|e| err(&e))?;
        c.draw_series((0..rows.len()).map(|i| {
            Text::new(
                format!("{}", i + 1),
                (i as f64 + 0.3, floor * 0.85),
                ("sans-serif", if rows.len() > 12 { 9 } else { 12 }),
            )
        }))
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
        // Each bar's value over it, while there is room (past 16 bars they overlap: the
        // table has the numbers).
        let value_font = match rows.len() {
            0..=8 => 13,
            9..=16 => 10,
            _ => 0,
        };
        if value_font > 0 {
            c.draw_series(values.iter().enumerate().map(|(i, v)| {
                let (label, y) = if v.is_finite() {
                    (format!("{v:.*}", decimals.max(1)), *v)
                } else {
                    ("-".to_string(), 0.0)
                };
                Text::new(
                    label,
                    (i as f64 + 0.15, y + top_v * 0.035),
                    ("sans-serif", value_font),
                )
            }))
            .map_err(|e| err(&e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row up to 32 has a colour and line pattern of its own: the palette's eight
    /// solid, then three dash patterns (rows 17-24 were drawn as rows 1-8).
    #[test]
    fn thirty_two_rows_are_drawn_alike_by_none() {
        type Look = ((u8, u8, u8), Option<(u32, u32)>);
        let looks: Vec<Look> = (0..32)
            .map(|i| {
                let c = colour(i);
                ((c.0, c.1, c.2), dashes(i))
            })
            .collect();
        for (i, a) in looks.iter().enumerate() {
            for (j, b) in looks.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "rows {} and {} look alike", i + 1, j + 1);
            }
        }
        assert_eq!(dashes(7), None);
        assert_eq!(dashes(32), dashes(8));
    }
}
