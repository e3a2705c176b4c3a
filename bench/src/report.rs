//! The suite's outputs: `results.json` (everything measured), `results.md` (each
//! figure beside its ratio to the machine's own limits) and two SVG plots drawn
//! with plotters: throughput over time and latency percentiles.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use serde_json::Value;

/// Writes the three outputs into `out`; returns the markdown.
pub fn write(out: &Path, results: &Value) -> anyhow::Result<String> {
    let json = serde_json::to_string_pretty(results)?;
    std::fs::write(out.join("results.json"), json + "\n")
        .with_context(|| format!("writing {}/results.json", out.display()))?;
    let md = markdown(results);
    std::fs::write(out.join("results.md"), &md)
        .with_context(|| format!("writing {}/results.md", out.display()))?;
    throughput_plot(&out.join("throughput.svg"), results)?;
    latency_plot(&out.join("latency.svg"), results)?;
    Ok(md)
}

fn f(v: &Value, path: &str) -> f64 {
    path.split('.')
        .try_fold(v, |v, key| v.get(key))
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN)
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// "; 1.02x the disk written as the engine commits, {what}" when measured.
fn versus_synced(mb_s: f64, synced: f64, what: &str) -> String {
    if synced.is_finite() && synced > 0.0 {
        format!(
            "; {:.2}x the disk written as the engine commits, {what}",
            mb_s / synced
        )
    } else {
        String::new()
    }
}

fn target_mark(ratio: f64, target: f64) -> &'static str {
    if ratio >= target {
        "met"
    } else {
        "missed"
    }
}

/// The results table: one row per figure, with its ratio to the baseline that
/// bounds it.
pub fn markdown(r: &Value) -> String {
    let disk_w = f(r, "baseline.disk_write_mb_s");
    let disk_r = f(r, "baseline.disk_read_mb_s");
    let lo = f(r, "baseline.loopback_mb_s");
    let limit = disk_w.min(lo);
    let mut md = String::new();
    let m = &r["machine"];
    let _ = writeln!(
        md,
        "# skiff-bench suite{}\n",
        if r["quick"].as_bool() == Some(true) {
            " (quick)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "Machine: {} cores ({}), {} GiB, kernel {}, disk {}.\n",
        m["nproc"],
        s(m, "cpu"),
        m["memory_gib"],
        s(m, "kernel"),
        s(m, "disk")
    );
    let p = &r["plan"];
    let _ = writeln!(
        md,
        "Workloads: {} B records, {} partitions, {} connections x {} in flight, batches of {} KiB (e2e: {} KiB at {} records/s); one node started by the suite, log.durability=flush (fdatasync before every acknowledgement, acks=1 too); the replicated row: {} nodes started by the suite on this machine, replication factor {}, min.insync.replicas={}.\n",
        p["record_size"], p["partitions"], p["connections"], p["max_in_flight"],
        p["batch_bytes"].as_u64().unwrap_or(0) >> 10, p["e2e_batch_bytes"].as_u64().unwrap_or(0) >> 10, p["e2e_rate_records_s"],
        p["replicated_nodes"], p["replication_factor"], p["min_insync_replicas"]
    );
    let rounds = &r["baseline"]["rounds"];
    let n_rounds = rounds["disk_write"].as_array().map_or(0, Vec::len);
    let _ = writeln!(
        md,
        "Disk and engine: the sweep's best setting (one burst per setting) is measured again in {n_rounds} round(s), each the disk, fio and the engine in turn; every disk and engine figure below is the median of its rounds, and the disk's limit is the highest of the in-process write into fresh space, the in-process write over written blocks, and fio.\n"
    );
    let _ = writeln!(
        md,
        "| what | MB/s | records/s | p50 ms | p99 ms | p99.9 ms | max ms | ratio |"
    );
    let _ = writeln!(
        md,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    let bw = &r["baseline"]["disk_sweep"]["best_write"];
    let br = &r["baseline"]["disk_sweep"]["best_read"];
    let _ = writeln!(
        md,
        "| raw O_DIRECT write into fresh space ({} streams at {} KiB, queue depth {}: sweep burst {:.0}, rounds {}) | {:.0} | | | | | | |",
        p["disk_streams"],
        bw["block_kib"],
        bw["queue_depth"],
        f(bw, "write_mb_s"),
        list(&rounds["disk_write"]),
        f(r, "baseline.disk_fresh_write_mb_s")
    );
    let ow = f(r, "baseline.disk_overwrite_mb_s");
    if ow.is_finite() {
        let _ = writeln!(
            md,
            "| raw O_DIRECT write over written blocks (same setting, each file written once before; rounds {}) | {ow:.0} | | | | | | |",
            list(&rounds["disk_overwrite"])
        );
    }
    let _ = writeln!(
        md,
        "| the disk's write limit (the highest of the two above and fio) | {disk_w:.0} | | | | | | the disk's limit |"
    );
    let sync = &r["baseline"]["disk_synced"];
    let (sf, so) = (
        f(r, "baseline.disk_synced.fresh_write_mb_s"),
        f(r, "baseline.disk_synced.overwrite_mb_s"),
    );
    if sf.is_finite() {
        let _ = writeln!(
            md,
            "| raw O_DIRECT write as the engine commits ({} KiB, queue depth {}, an fdatasync every {} MiB) into fresh space (rounds {}) | {sf:.0} | | | | | | {:.2}x the disk's limit |",
            sync["block_kib"],
            sync["queue_depth"],
            sync["fdatasync_every_mib"],
            list(&rounds["disk_synced_fresh"]),
            sf / disk_w
        );
        let _ = writeln!(
            md,
            "| the same over written blocks (rounds {}) | {so:.0} | | | | | | {:.2}x the disk's limit |",
            list(&rounds["disk_synced_overwrite"]),
            so / disk_w
        );
    }
    let _ = writeln!(
        md,
        "| raw O_DIRECT read (at {} KiB, queue depth {}: sweep burst {:.0}, rounds {}) | {disk_r:.0} | | | | | | |",
        br["block_kib"],
        br["queue_depth"],
        f(br, "read_mb_s"),
        list(&rounds["disk_read"])
    );
    let fw = f(r, "baseline.fio.write_mb_s");
    if fw.is_finite() {
        let _ = writeln!(
            md,
            "| fio at the best write setting ({}; write rounds {}) | write {fw:.0}, read {:.0} | | | | | | counted in the disk's limit |",
            s(&r["baseline"]["fio"], "ioengine"),
            list(&rounds["fio_write"]),
            f(r, "baseline.fio.read_mb_s")
        );
    }
    let _ = writeln!(
        md,
        "| loopback TCP, one stream | {lo:.0} | | | | | | the network's limit |"
    );
    let ea = f(r, "engine.append_mb_s");
    let _ = writeln!(
        md,
        "| engine append (in-process, 1 MiB batches, 4 in flight per partition; rounds {}) | {ea:.0} | | | | | | {:.2}x disk write (target 0.9: {}){} |",
        list(&rounds["engine_append"]),
        ea / disk_w,
        target_mark(ea / disk_w, 0.9),
        versus_synced(ea, sf, "into fresh space")
    );
    let es = f(r, "engine.steady_append_mb_s");
    if es.is_finite() {
        let _ = writeln!(
            md,
            "| engine append at steady state (retention on, new segments reuse the files it removes; rounds {}) | {es:.0} | | | | | | {:.2}x disk write{} |",
            list(&rounds["engine_steady_append"]),
            es / disk_w,
            versus_synced(es, so, "over written blocks")
        );
    }
    let er = f(r, "engine.read_cold_mb_s");
    let _ = writeln!(
        md,
        "| engine cold read | {er:.0} | | | | | | {:.2}x disk read |",
        er / disk_r
    );
    for w in r["workloads"].as_array().into_iter().flatten() {
        let name = s(w, "name");
        let mb_s = f(w, "mb_s");
        let ratio = match s(w, "kind") {
            "produce"
                if name == "produce acks=1 none"
                    || name.starts_with("produce acks=1 none at steady state") =>
            {
                format!(
                    "{:.2}x min(disk write, loopback) (target 0.6: {})",
                    mb_s / limit,
                    target_mark(mb_s / limit, 0.6)
                )
            }
            "produce" if name.starts_with("produce probe") => format!(
                "latency probe at {} records/s (no quota)",
                f(w, "report.rate")
            ),
            "produce" if name.starts_with("produce idempotent") => format!(
                "{:.2}x acks=all none",
                f(r, "producer_modes.idempotent.vs_plain")
            ),
            "produce" if name.starts_with("produce transactional") => format!(
                "{:.2}x acks=all none",
                f(r, "producer_modes.transactional.vs_plain")
            ),
            "produce" if name.ends_with("over TLS") => format!(
                "{:.2}x the same produce in plaintext",
                f(r, "tls.produce_vs_plaintext")
            ),
            "produce" => format!("{:.2}x min(disk write, loopback)", mb_s / limit),
            "consume" if name.ends_with("over TLS") => format!(
                "{:.2}x the same read in plaintext",
                f(r, "tls.consume_vs_plaintext")
            ),
            "consume" if name.starts_with("consume hot") => format!(
                "{:.2}x loopback (target 0.7: {})",
                mb_s / lo,
                target_mark(mb_s / lo, 0.7)
            ),
            "consume" => format!("{:.2}x min(disk read, loopback)", mb_s / disk_r.min(lo)),
            "replicated" => format!(
                "{:.2}x single-node produce acks=all none",
                f(r, "ratios.replicated_vs_single")
            ),
            _ => "end-to-end latency".to_string(),
        };
        let lat = |key: &str| {
            let v = f(w, &format!("latency.{key}"));
            if v.is_nan() {
                String::new()
            } else {
                format!("{v:.2}")
            }
        };
        let _ = writeln!(
            md,
            "| {name} | {mb_s:.0} | {:.0} | {} | {} | {} | {} | {ratio} |",
            f(w, "records_s"),
            lat("p50_ms"),
            lat("p99_ms"),
            lat("p999_ms"),
            lat("max_ms"),
        );
    }
    let _ = writeln!(
        md,
        "\nProduce MB/s count record values (Kafka's producer-perf-test convention); consume MB/s count record batch bytes received. Produce latency is per request; e2e latency is per record, from the producer's intended send time to the consumer seeing it (1 ms resolution: Kafka timestamps are milliseconds). The replicated row is acks=all produce against a {}-node cluster on this same machine (every replica shares its disk and cores, and the load generator's), each connection to its partitions' leader ({} connections; partitions led per node: {}); a request is answered once every in-sync replica has the records flushed.",
        r["replicated"]["nodes"],
        r["replicated"]["connections"],
        r["replicated"]["leaders_per_node"]
            .as_object()
            .map(|m| m
                .iter()
                .map(|(node, n)| format!("node {node}: {n}"))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    let t = &r["producer_modes"]["transactional"];
    if t.is_object() {
        let _ = writeln!(
            md,
            "\nProducer modes: the acks=all/none produce again as an idempotent producer (a producer id, every batch sequenced) and as a transactional one (AddPartitionsToTxn for all {} partitions, {} ms of produce, every answer awaited, EndTxn commit): {:.0} transactions committed, commit (EndTxn round trip) p50/p99/max {:.2}/{:.2}/{:.2} ms; each row's ratio is its MB/s over the plain acks=all none row.",
            p["partitions"],
            f(t, "commit_interval_ms"),
            f(t, "transactions"),
            f(t, "commit_p50_ms"),
            f(t, "commit_p99_ms"),
            f(t, "commit_max_ms"),
        );
    }
    let q = &r["quota"];
    if q.is_object() {
        let _ = writeln!(
            md,
            "\nClient quota: a producer with a producer_byte_rate quota of {:.0} MB/s, offered as much as it could send, made {:.1} MB/s over whole windows after its first ({:.3}x its quota; {} windows of 1 s; record values, which the quota's batch bytes exceed by about 1%); a probe producer beside it without a quota had p50/p99 {:.2}/{:.2} ms, against {:.2}/{:.2} ms alone.",
            f(q, "limit_mb_s"),
            f(q, "greedy_mb_s"),
            f(q, "greedy_vs_quota"),
            f(q, "window_num"),
            f(q, "probe_beside_p50_ms"),
            f(q, "probe_beside_p99_ms"),
            f(q, "probe_alone_p50_ms"),
            f(q, "probe_alone_p99_ms"),
        );
    }
    md
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn plot_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing a plot: {e:?}")
}

/// MB/s over time for every workload, with the disk and loopback limits.
fn throughput_plot(path: &Path, r: &Value) -> anyhow::Result<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = r["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| s(w, "kind") != "e2e")
        .map(|w| {
            let points = w["timeline"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| (f(p, "t_s"), f(p, "mb_s")))
                .filter(|(t, v)| t.is_finite() && v.is_finite())
                .collect();
            (s(w, "name").to_string(), points)
        })
        .collect();
    let limits = [
        ("raw disk write", f(r, "baseline.disk_write_mb_s")),
        ("loopback TCP", f(r, "baseline.loopback_mb_s")),
    ];
    let t_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .fold(1.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.1))
        .chain(limits.iter().map(|l| l.1).filter(|v| v.is_finite()))
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "skiff-bench suite: throughput over time",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the workload")
        .y_desc("MB/s")
        .light_line_style(WHITE)
        .draw()
        .map_err(plot_error)?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(plot_error)?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    for (name, value) in limits.iter().filter(|l| l.1.is_finite()) {
        let style = ShapeStyle::from(&BLACK.mix(0.5)).stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, *value), (t_max, *value)],
                6,
                4,
                style,
            ))
            .map_err(plot_error)?
            .label(format!("{name} {value:.0} MB/s"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::MiddleRight)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// Latency percentile curves (x: percentile as "nines", y: ms, log scale).
fn latency_plot(path: &Path, r: &Value) -> anyhow::Result<()> {
    let nines = |q: f64| -(1.0 - q).max(1e-9).log10();
    let series: Vec<(String, Vec<(f64, f64)>)> = r["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let points: Vec<(f64, f64)> = w["latency_curve"]
                .as_array()?
                .iter()
                .filter_map(|p| Some((nines(p.get(0)?.as_f64()?), p.get(1)?.as_f64()?.max(0.001))))
                .collect();
            (!points.is_empty()).then(|| (s(w, "name").to_string(), points))
        })
        .collect();
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .fold(3.0f64, f64::max);
    let (y_min, y_max) = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.1))
        .fold((f64::MAX, 0.01f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let y_min = if y_min == f64::MAX {
        0.01
    } else {
        (y_min / 2.0).max(0.001)
    };
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("skiff-bench suite: latency percentiles", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(nines(0.5)..x_max, (y_min..y_max * 2.0).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("ms")
        .light_line_style(WHITE)
        .x_labels(8)
        .x_label_formatter(&|x| {
            let q = 100.0 * (1.0 - 10f64.powf(-x));
            let text = format!("{q:.4}");
            let text = text.trim_end_matches('0').trim_end_matches('.');
            format!("{text}%")
        })
        .draw()
        .map_err(plot_error)?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(plot_error)?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// A JSON array of MB/s figures as "a / b / c" (whole numbers).
fn list(v: &serde_json::Value) -> String {
    let figures: Vec<String> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_f64)
        .map(|x| format!("{x:.0}"))
        .collect();
    if figures.is_empty() {
        "-".to_string()
    } else {
        figures.join(" / ")
    }
}
