//! Latency distributions as SVG: one chart per phase, one row per case, each
//! row a box (p25–p75) with its median, whiskers from p1 to p99 and a cross
//! at the maximum, and the case's p50 / p99 / n written beside it. SVG text is
//! laid out by the viewer, so no font is needed to draw it.

use crate::measure::percentile;
use anyhow::Context;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::{Path, PathBuf};

/// One measured case: its name and its latencies in milliseconds.
pub struct Case {
    pub name: String,
    pub samples_ms: Vec<f64>,
}

/// A phase's latency distributions, written as `<stem>.svg`.
pub struct Chart {
    pub stem: &'static str,
    pub title: String,
    pub cases: Vec<Case>,
}

impl Chart {
    pub fn new(stem: &'static str, title: impl Into<String>) -> Chart {
        Chart {
            stem,
            title: title.into(),
            cases: Vec::new(),
        }
    }

    pub fn case(&mut self, name: impl Into<String>, samples_ms: &[f64]) {
        self.cases.push(Case {
            name: name.into(),
            samples_ms: samples_ms.to_vec(),
        });
    }

    /// Writes the chart into `dir` (made if missing); returns the file.
    pub fn write(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        let svg = self.render()?;
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the chart folder {}", dir.display()))?;
        let path = dir.join(format!("{}.svg", self.stem));
        std::fs::write(&path, svg)
            .with_context(|| format!("cannot write the chart {}", path.display()))?;
        Ok(path)
    }

    pub fn render(&self) -> anyhow::Result<String> {
        anyhow::ensure!(
            !self.cases.is_empty(),
            "chart {:?} has no case to draw",
            self.stem
        );
        let rows: Vec<Row> = self.cases.iter().map(Row::of).collect();
        let drawn: Vec<&Spread> = rows.iter().filter_map(|r| r.spread.as_ref()).collect();
        anyhow::ensure!(
            !drawn.is_empty(),
            "chart {:?}: none of its cases has a sample",
            self.stem
        );
        let lowest = drawn.iter().map(|s| s.p1).fold(f64::INFINITY, f64::min);
        let highest = drawn.iter().map(|s| s.max).fold(0.0, f64::max);
        let mut svg = String::new();
        let size = (WIDTH, TOP + ROW_HEIGHT * rows.len() as u32 + BOTTOM);
        // Spans of two decades and more are drawn on a log scale, so that a
        // sub-millisecond case and a second-long one both show their shape.
        if lowest > 0.0 && highest / lowest >= LOG_SCALE_SPAN {
            let x = (lowest / 1.25..highest * 1.25).log_scale();
            draw(
                &mut svg,
                size,
                &self.title,
                &rows,
                x,
                "milliseconds (log scale)",
            )?;
        } else {
            let x: RangedCoordf64 = (0.0..(highest * 1.05).max(f64::MIN_POSITIVE)).into();
            draw(&mut svg, size, &self.title, &rows, x, "milliseconds")?;
        }
        Ok(svg)
    }
}

const WIDTH: u32 = 960;
const ROW_HEIGHT: u32 = 34;
const TOP: u32 = 48;
const BOTTOM: u32 = 84;
const LEGEND_HEIGHT: u32 = 30;
const NAME_AREA: u32 = 250;
const FIGURES_AREA: u32 = 230;
const LOG_SCALE_SPAN: f64 = 100.0;
/// How much of a row its box fills, as a half-height in rows.
const BOX_HALF: f64 = 0.28;

/// The percentiles a row draws.
struct Spread {
    p1: f64,
    p25: f64,
    p50: f64,
    p75: f64,
    p99: f64,
    max: f64,
}

struct Row<'a> {
    name: &'a str,
    n: usize,
    spread: Option<Spread>,
}

impl Row<'_> {
    fn of(case: &Case) -> Row<'_> {
        let mut s: Vec<f64> = case
            .samples_ms
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        let spread = (!s.is_empty()).then(|| Spread {
            p1: percentile(&mut s, 1.0),
            p25: percentile(&mut s, 25.0),
            p50: percentile(&mut s, 50.0),
            p75: percentile(&mut s, 75.0),
            p99: percentile(&mut s, 99.0),
            max: percentile(&mut s, 100.0),
        });
        Row {
            name: &case.name,
            n: s.len(),
            spread,
        }
    }

    fn figures(&self) -> String {
        match &self.spread {
            Some(s) => format!(
                "p50 {} · p99 {} ms (n={})",
                short_ms(s.p50),
                short_ms(s.p99),
                self.n
            ),
            None => "no samples".to_string(),
        }
    }
}

/// Three significant digits, so small and large figures read alike.
fn short_ms(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

fn draw<X>(
    svg: &mut String,
    size: (u32, u32),
    title: &str,
    rows: &[Row],
    x: X,
    x_desc: &str,
) -> anyhow::Result<()>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let root = SVGBackend::with_string(svg, size).into_drawing_area();
    root.fill(&WHITE).map_err(plotting)?;
    let n = rows.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        // Room below the axis for the legend.
        .margin_bottom(LEGEND_HEIGHT)
        .x_label_area_size(40)
        .set_label_area_size(LabelAreaPosition::Left, NAME_AREA)
        .set_label_area_size(LabelAreaPosition::Right, FIGURES_AREA)
        .build_cartesian_2d(x, -0.5..n - 0.5)
        .map_err(plotting)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc(x_desc)
        .x_label_formatter(&|v| short_ms(*v))
        .draw()
        .map_err(plotting)?;

    let ink = RGBColor(31, 90, 160);
    let fill = RGBColor(180, 205, 235);
    let x_range = chart.x_range();
    let left = x_range.start;
    let right = x_range.end;
    let name_style =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    let figures_style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, row) in rows.iter().enumerate() {
        // Row 0 at the top, as a table reads.
        let y = n - 1.0 - i as f64;
        let (name_x, name_y) = chart.backend_coord(&(left, y));
        root.draw(&Text::new(
            row.name.to_string(),
            (name_x - 8, name_y),
            name_style.clone(),
        ))
        .map_err(plotting)?;
        let (fig_x, fig_y) = chart.backend_coord(&(right, y));
        root.draw(&Text::new(
            row.figures(),
            (fig_x + 8, fig_y),
            figures_style.clone(),
        ))
        .map_err(plotting)?;
        let Some(s) = &row.spread else { continue };
        let whisker = ink.stroke_width(1);
        let elements = [
            PathElement::new(vec![(s.p1, y), (s.p25, y)], whisker),
            PathElement::new(vec![(s.p75, y), (s.p99, y)], whisker),
            PathElement::new(
                vec![(s.p1, y - BOX_HALF / 2.0), (s.p1, y + BOX_HALF / 2.0)],
                whisker,
            ),
            PathElement::new(
                vec![(s.p99, y - BOX_HALF / 2.0), (s.p99, y + BOX_HALF / 2.0)],
                whisker,
            ),
        ];
        chart.draw_series(elements).map_err(plotting)?;
        chart
            .draw_series([
                Rectangle::new(
                    [(s.p25, y - BOX_HALF), (s.p75, y + BOX_HALF)],
                    fill.filled(),
                ),
                Rectangle::new([(s.p25, y - BOX_HALF), (s.p75, y + BOX_HALF)], ink),
            ])
            .map_err(plotting)?;
        chart
            .draw_series([PathElement::new(
                vec![(s.p50, y - BOX_HALF), (s.p50, y + BOX_HALF)],
                ink.stroke_width(3),
            )])
            .map_err(plotting)?;
        chart
            .draw_series([Cross::new((s.max, y), 4, RED.stroke_width(2))])
            .map_err(plotting)?;
    }
    let legend = "box: p25–p75, thick bar: p50, whiskers: p1–p99, red cross: max";
    root.draw(&Text::new(
        legend,
        (NAME_AREA as i32, size.1 as i32 - 12),
        ("sans-serif", 13).into_font(),
    ))
    .map_err(plotting)?;
    root.present().map_err(plotting)?;
    Ok(())
}

fn plotting<E: std::error::Error + Send + Sync>(err: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart failed: {err}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use quick_xml::events::Event;
    use quick_xml::Reader;

    /// Every element of `svg` (checking it is well-formed XML with an `svg`
    /// root) and the text of each `<text>` element, unescaped and trimmed.
    fn parse(svg: &str) -> (Vec<String>, Vec<String>) {
        let mut reader = Reader::from_str(svg);
        let mut elements = Vec::new();
        let mut texts = Vec::new();
        let mut open: Vec<String> = Vec::new();
        let mut text = String::new();
        let name_of = |raw: &[u8]| String::from_utf8(raw.to_vec()).unwrap();
        loop {
            match reader.read_event().expect("well-formed XML") {
                Event::Start(e) => {
                    let name = name_of(e.name().as_ref());
                    elements.push(name.clone());
                    open.push(name);
                    text.clear();
                }
                Event::Empty(e) => elements.push(name_of(e.name().as_ref())),
                Event::End(e) => {
                    let name = name_of(e.name().as_ref());
                    assert_eq!(open.pop().as_deref(), Some(name.as_str()), "nesting");
                    if name == "text" {
                        texts.push(text.trim().to_string());
                    }
                }
                Event::Text(t) => text.push_str(&t.decode().unwrap()),
                Event::GeneralRef(r) => {
                    let entity = name_of(&r);
                    text.push_str(
                        quick_xml::escape::resolve_predefined_entity(&entity)
                            .expect("a predefined entity"),
                    );
                }
                Event::Eof => break,
                _ => {}
            }
        }
        assert!(open.is_empty(), "unclosed elements: {open:?}");
        assert_eq!(elements.first().map(String::as_str), Some("svg"), "root");
        (elements, texts)
    }

    /// Milliseconds 1..=n scaled by `factor`: a known spread.
    fn ramp(n: usize, factor: f64) -> Vec<f64> {
        (1..=n).map(|i| i as f64 * factor).collect()
    }

    #[test]
    fn renders_valid_svg_with_every_case_and_its_figures() {
        let mut chart = Chart::new("lease", "lease: step latency");
        chart.case("http poll", &ramp(100, 0.01));
        chart.case("sql poll (1 stmt)", &ramp(100, 0.005));
        chart.case("<ack> & co", &ramp(10, 1.0));
        let svg = chart.render().unwrap();
        let (elements, texts) = parse(&svg);
        assert!(elements.iter().any(|e| e == "rect"), "boxes drawn");
        for name in ["http poll", "sql poll (1 stmt)", "<ack> & co"] {
            assert!(texts.iter().any(|t| t == name), "{name:?} in {texts:?}");
        }
        assert!(
            texts.iter().any(|t| t == "lease: step latency"),
            "{texts:?}"
        );
        // Nearest rank: p50 of 1..=100 × 0.01 is 0.50, p99 is 0.99.
        assert!(
            texts.iter().any(|t| t == "p50 0.50 · p99 0.99 ms (n=100)"),
            "{texts:?}"
        );
        assert!(
            texts.iter().any(|t| t == "p50 5.00 · p99 10.0 ms (n=10)"),
            "{texts:?}"
        );
    }

    #[test]
    fn wide_spreads_get_a_log_axis_and_narrow_ones_a_linear_one() {
        let mut wide = Chart::new("wide", "wide");
        wide.case("fast", &ramp(100, 0.01));
        wide.case("slow", &ramp(100, 1.0));
        // p1 of the fast case is 0.01 ms and the maximum 100 ms: 10,000×.
        let (_, texts) = parse(&wide.render().unwrap());
        assert!(
            texts.iter().any(|t| t == "milliseconds (log scale)"),
            "{texts:?}"
        );

        let mut narrow = Chart::new("narrow", "narrow");
        narrow.case("a", &ramp(100, 0.5));
        narrow.case("b", &[0.0, 1.0, 2.0]);
        let (_, texts) = parse(&narrow.render().unwrap());
        assert!(texts.iter().any(|t| t == "milliseconds"), "{texts:?}");
    }

    #[test]
    fn a_case_without_samples_is_shown_as_such_and_a_chart_of_none_is_refused() {
        let mut chart = Chart::new("some", "some");
        chart.case("measured", &[1.0, 2.0]);
        chart.case("skipped", &[]);
        let (_, texts) = parse(&chart.render().unwrap());
        assert!(texts.iter().any(|t| t == "skipped"), "{texts:?}");
        assert!(texts.iter().any(|t| t == "no samples"), "{texts:?}");

        let mut empty = Chart::new("empty", "empty");
        empty.case("skipped", &[f64::NAN]);
        let err = empty.render().unwrap_err().to_string();
        assert!(err.contains("none of its cases has a sample"), "{err}");
        let err = Chart::new("bare", "bare").render().unwrap_err().to_string();
        assert!(err.contains("has no case"), "{err}");
    }

    #[test]
    fn writes_the_chart_into_the_folder_it_makes() {
        let dir = std::env::temp_dir().join(format!("mango-bench-chart-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut chart = Chart::new("wake", "wake");
        chart.case("create → claimed", &ramp(30, 0.1));
        let path = chart.write(&dir.join("nested")).unwrap();
        assert_eq!(path, dir.join("nested").join("wake.svg"));
        let (_, texts) = parse(&std::fs::read_to_string(&path).unwrap());
        assert!(texts.iter().any(|t| t == "create → claimed"), "{texts:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
