//! Charts for `cordon bench` and `cordon cost`, drawn with plotters' SVG backend: SVG text
//! is laid out by whatever shows the file, so no font has to be installed on the host that
//! draws it, and the file opens in any browser.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One bar of the bench chart.
pub struct Bar {
    pub label: String,
    /// A peer (drawn grey) rather than a Cordon tier or the CLI (drawn blue).
    pub peer: bool,
    pub value_us: u64,
}

fn fmt_us(us: f64) -> String {
    cordon_core::units::format_duration(std::time::Duration::from_micros(us as u64))
}

/// Draws the legend in the upper left and writes the file.
fn legend_and_save<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    root: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("{e}")
}

const TIER_BLUE: RGBColor = RGBColor(46, 110, 180);
const PEER_GREY: RGBColor = RGBColor(150, 150, 150);

/// A bar per subject: median start-up time on a log scale, tiers blue, peers grey.
pub fn bench_svg(path: &Path, bars: &[Bar], host: &str) -> Result<()> {
    if bars.is_empty() {
        return Err(anyhow!("nothing was measured, so there is nothing to draw"));
    }
    let n = bars.len();
    let max = bars.iter().map(|b| b.value_us).max().unwrap_or(1).max(1) as f64;
    let min = bars.iter().map(|b| b.value_us).min().unwrap_or(1).max(1) as f64;
    // Whole decades around the data, so bars start at the bottom edge.
    let lo = 10f64.powf(min.log10().floor()).max(1.0) / 10.0;
    let hi = 10f64.powf(max.log10().ceil() + 0.3);
    let width = (120 + 90 * n as u32).max(640);
    let root = SVGBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let title = if host.is_empty() {
        "cordon bench: start-up, create + trivial exec + destroy (median)".to_string()
    } else {
        format!("cordon bench on {host}: start-up, create + trivial exec + destroy (median)")
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        // An integer range is inclusive here: 0..n-1 makes n segments.
        .build_cartesian_2d((0..n.max(2) - 1).into_segmented(), (lo..hi).log_scale())
        .map_err(err)?;
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("median, log scale")
        .y_label_formatter(&|v| fmt_us(*v))
        .draw()
        .map_err(err)?;
    for (peer, name, color) in [
        (false, "Cordon (tiers, CLI)", TIER_BLUE),
        (true, "peers", PEER_GREY),
    ] {
        let series: Vec<(usize, &Bar)> = bars
            .iter()
            .enumerate()
            .filter(|(_, b)| b.peer == peer)
            .collect();
        if series.is_empty() {
            continue;
        }
        chart
            .draw_series(series.iter().map(|(i, b)| {
                let mut r = Rectangle::new(
                    [
                        (SegmentValue::Exact(*i), lo),
                        (
                            SegmentValue::Exact(*i + 1),
                            (b.value_us.max(1) as f64).max(lo),
                        ),
                    ],
                    color.filled(),
                );
                r.set_margin(0, 0, 8, 8);
                r
            }))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart
            .draw_series(series.iter().map(|(i, b)| {
                Text::new(
                    fmt_us(b.value_us as f64),
                    (SegmentValue::CenterOf(*i), b.value_us.max(1) as f64 * 1.08),
                    ("sans-serif", 12)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )
            }))
            .map_err(err)?;
    }
    legend_and_save(&mut chart, &root)
}

/// The cost chart's data: monthly cost of each option over a range of monthly volumes.
pub struct CostCurve {
    pub volumes: Vec<f64>,
    pub hosted: Vec<f64>,
    pub self_hosted: Vec<f64>,
    pub crossover: Option<f64>,
    /// The user's own volume, marked with a vertical line.
    pub volume: f64,
    pub currency: String,
}

/// Two lines (hosted, self-hosted) of monthly cost against executions per month, the
/// crossover marked.
pub fn cost_svg(path: &Path, c: &CostCurve) -> Result<()> {
    let xmax = c.volumes.iter().cloned().fold(1.0, f64::max);
    let ymax = c
        .hosted
        .iter()
        .chain(c.self_hosted.iter())
        .cloned()
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "cordon cost: monthly cost, hosted vs self-hosted",
            ("sans-serif", 18),
        )
        .margin(14)
        .x_label_area_size(45)
        .y_label_area_size(90)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(err)?;
    let cur = c.currency.clone();
    chart
        .configure_mesh()
        .x_desc("executions per month")
        .y_desc(format!("monthly cost ({})", c.currency))
        .x_label_formatter(&|v| human(*v))
        .y_label_formatter(&|v| format!("{}{}", cur, human(*v)))
        .draw()
        .map_err(err)?;
    let hosted_color = RGBColor(200, 80, 40);
    chart
        .draw_series(LineSeries::new(
            c.volumes.iter().cloned().zip(c.hosted.iter().cloned()),
            hosted_color.stroke_width(2),
        ))
        .map_err(err)?
        .label("hosted")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], hosted_color));
    chart
        .draw_series(LineSeries::new(
            c.volumes.iter().cloned().zip(c.self_hosted.iter().cloned()),
            TIER_BLUE.stroke_width(2),
        ))
        .map_err(err)?
        .label("self-hosted")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], TIER_BLUE));
    if c.volume > 0.0 && c.volume <= xmax {
        let green = RGBColor(40, 140, 70);
        chart
            .draw_series(LineSeries::new(
                [(c.volume, 0.0), (c.volume, ymax)],
                green.stroke_width(2),
            ))
            .map_err(err)?
            .label("your volume")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], green));
        chart
            .draw_series([Text::new(
                format!(" your volume: {}", human(c.volume)),
                (c.volume, ymax * 0.97),
                ("sans-serif", 13).into_font().color(&green),
            )])
            .map_err(err)?;
    }
    if let Some(x) = c.crossover.filter(|x| *x <= xmax) {
        let y = interpolate(&c.volumes, &c.hosted, x);
        chart
            .draw_series([Circle::new((x, y), 6, BLACK.filled())])
            .map_err(err)?
            .label("crossover")
            .legend(|(x, y)| Circle::new((x + 8, y), 4, BLACK.filled()));
        chart
            .draw_series([Text::new(
                format!("crossover: {} executions/month", human(x)),
                (x, y + ymax * 0.04),
                ("sans-serif", 13).into_font().color(&BLACK),
            )])
            .map_err(err)?;
    }
    legend_and_save(&mut chart, &root)
}

fn interpolate(xs: &[f64], ys: &[f64], x: f64) -> f64 {
    for i in 1..xs.len().min(ys.len()) {
        if xs[i] >= x {
            let (x0, x1, y0, y1) = (xs[i - 1], xs[i], ys[i - 1], ys[i]);
            if x1 <= x0 {
                return y1;
            }
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
        }
    }
    ys.last().copied().unwrap_or(0.0)
}

/// 1234567 -> "1.23M".
pub fn human(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
