// The seeds-and-arrivals table: Fig. 11's 560-function point over seeds 1..N, under Poisson and
// Azure-shaped arrivals, with per-request execution-time variation, for a list of named
// configurations (--policies).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "sim/experiment_support.h"
#include "sim/experiments_internal.h"
#include "sim/seeds_table.h"

namespace hiber::sim {
namespace {

constexpr Duration kMeasured = 10 * 60 * kSecond;
constexpr int kFunctions = 560;
// Per-request execution-time CVs (sim/exec_variation.h; an assumption, documented there).
constexpr double kVisionCv = 0.05;
constexpr double kLanguageCv = 0.10;

// A named configuration fixes its admission rule too, whatever --shed says.
SystemSpec hiber_with(const ExperimentOptions& o, std::string_view name, std::string placement,
                      std::string eviction, std::string queue,
                      scheduler::ShedRule shed = scheduler::ShedRule::kNone) {
  SystemSpec s = hiber_system(o, std::string(name), std::move(placement), std::move(eviction),
                              std::move(queue));
  s.hiber.scheduler.shed = shed;
  return s;
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

double quantile_of(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// Target and generated burst statistics of the functions' Azure-shaped arrivals over a day each,
// beside Poisson's, as quartiles across functions.
std::string arrival_statistics(const Workload& w, uint64_t seed) {
  constexpr int kMinutes = 1440;
  std::vector<double> stats[3][3];  // [target, azure, poisson][cv, idle, lag1]
  scheduler::Rng rng(seed);
  for (const SimFunction& f : w.functions) {
    const MinuteStats target = default_burst_target(f.rate_per_min, rng);
    const RateProcess shape = *fit_rate_process(target, f.rate_per_min);
    const MinuteStats got =
        minute_stats(generate_minute_counts(shape, f.rate_per_min, kMinutes, rng));
    const MinuteStats poisson =
        minute_stats(generate_minute_counts(RateProcess{}, f.rate_per_min, kMinutes, rng));
    int k = 0;
    for (const MinuteStats& s : {target, got, poisson}) {
      stats[k][0].push_back(s.cv);
      stats[k][1].push_back(s.idle_share);
      stats[k][2].push_back(s.lag1);
      ++k;
    }
  }
  const char* names[] = {"target (built-in)", "azure (generated)", "poisson (generated)"};
  std::vector<std::vector<std::string>> rows;
  for (int k = 0; k < 3; ++k) {
    std::vector<std::string> row = {names[k]};
    for (int s = 0; s < 3; ++s) {
      row.push_back(str_cat(fmt(quantile_of(stats[k][s], 0.25), 2), " / ",
                            fmt(quantile_of(stats[k][s], 0.5), 2), " / ",
                            fmt(quantile_of(stats[k][s], 0.75), 2)));
    }
    rows.push_back(std::move(row));
  }
  return markdown_table({"per-minute counts", "CV (p25 / p50 / p75)", "idle share", "lag-1 corr."},
                        rows);
}

std::string fmt_ms(double ms) { return std::isinf(ms) ? "inf" : fmt(ms, 0); }

}  // namespace

Spread spread_of(const std::vector<double>& v) {
  Spread s;
  const double n = static_cast<double>(v.size());
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  for (double x : v) s.mean += x / n;
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / (n - 1));
  }
  return s;
}

SeedsRow summarize_seeds(std::string config, std::string arrivals,
                         const std::vector<Results>& per_seed) {
  SeedsRow row;
  row.config = std::move(config);
  row.arrivals = std::move(arrivals);
  row.seeds = static_cast<int>(per_seed.size());
  const double n = static_cast<double>(per_seed.size());
  std::vector<double> compliant;
  std::vector<std::vector<double>> by_model(paper_models().size());
  for (const Results& r : per_seed) {
    compliant.push_back(100 * r.compliant_ratio);
    for (size_t m = 0; m < by_model.size(); ++m) {
      if (r.functions_by_model[m] == 0) continue;
      by_model[m].push_back(100.0 * r.compliant_by_model[m] / r.functions_by_model[m]);
      if (row.lowest_seed_model.empty() || by_model[m].back() < row.lowest_seed_pct) {
        row.lowest_seed_pct = by_model[m].back();
        row.lowest_seed_model = paper_models()[m].name;
      }
    }
    row.rejected += static_cast<double>(r.by_kind[static_cast<int>(StartKind::kRejected)]) / n;
    row.failed += static_cast<double>(r.by_kind[static_cast<int>(StartKind::kFailed)]) / n;
    row.unfinished += static_cast<double>(r.by_kind[static_cast<int>(StartKind::kUnfinished)]) / n;
    row.p99_ms += r.latency.p99 / n;  // +inf stays +inf
  }
  row.compliant_pct = spread_of(compliant);
  row.worst_model_pct = std::numeric_limits<double>::infinity();
  for (size_t m = 0; m < by_model.size(); ++m) {
    if (by_model[m].empty()) continue;
    const Spread s = spread_of(by_model[m]);
    if (s.mean < row.worst_model_pct) {
      row.worst_model_pct = s.mean;
      row.worst_model_min_pct = s.min;
      row.worst_model = paper_models()[m].name;
    }
  }
  return row;
}

bool meets_mean_goal(const SeedsRow& row) { return row.compliant_pct.mean >= kGoalCompliantPct; }
bool meets_class_goal(const SeedsRow& row) { return row.worst_model_pct >= kGoalClassPct; }
bool meets_class_goal_every_seed(const SeedsRow& row) {
  return row.lowest_seed_pct >= kGoalClassPct;
}

const std::vector<SeedsConfig>& seeds_configs() {
  using O = ExperimentOptions;
  static const std::vector<SeedsConfig> configs = {
      {"hiber-slo",
       "Hiber's placement and RRC queue (with EDF and demotion) plus the two SLO-aware "
       "mechanisms of issue 20 (docs/scheduler.md, \"Beyond the paper\"). `slack` eviction keeps "
       "a model as if it had been used up to 60 s later, by the cube of the share of its SLO a "
       "host load costs it: Bert-qa (a 144 ms load against a 200 ms SLO) stays resident, and the "
       "CNNs, whose loads fit their SLO from the host, swap instead. `--shed=hopeless` answers "
       "\"overloaded\" at once to a request the queue offers once it can no longer finish in time "
       "(execution alone, or a host load when no GPU holds the model, ends past its deadline), "
       "so a late request holds no GPU and evicts no model; shed requests are misses.",
       [](const O& o) {
         return hiber_with(o, "hiber-slo", "algorithm1", "slack", "rrc",
                           scheduler::ShedRule::kHopeless);
       }},
      {"hiber",
       "Hiber's defaults: Algorithm 1 placement (resident, then a peer copy, then the host), "
       "heaviness-aware eviction, and the RRC queue with two additions beyond the paper: "
       "earliest-deadline order within a priority group and demotion of requests that can no "
       "longer meet their deadline.",
       [](const O& o) { return hiber_with(o, "hiber", "algorithm1", "heaviness", "rrc"); }},
      {"torpor-paper",
       "Torpor as §5 describes it: Hiber's placement and eviction, the RRC queue's adaptive "
       "threshold, and arrival order within each group: no EDF, no demotion of late requests.",
       [](const O& o) {
         SystemSpec s = hiber_with(o, "torpor-paper", "algorithm1", "heaviness", "rrc");
         s.hiber.scheduler.queue_options.earliest_deadline_first = false;
         s.hiber.scheduler.queue_options.demote_late = false;
         return s;
       }},
      {"lru",
       "Hiber with least-recently-used eviction (Torpor-LRU): blind to model size and swap cost, "
       "so heavy models (Bert-qa) are evicted as readily as light ones.",
       [](const O& o) { return hiber_with(o, "lru", "algorithm1", "lru", "rrc"); }},
      {"fifo",
       "Hiber with a FIFO queue across functions (Torpor-FIFO): no SLO awareness at all; a "
       "request waits its turn however close its deadline is.",
       [](const O& o) { return hiber_with(o, "fifo", "algorithm1", "heaviness", "fifo"); }},
      {"gshare",
       "Hiber with gShare's dual-queue lazy scheduling: requests whose predicted swap plus "
       "execution exceeds the SLO go first in arrival order; the others wait, by slack, for the "
       "GPU that leaves them the largest margin.",
       [](const O& o) { return hiber_with(o, "gshare", "algorithm1", "heaviness", "gshare"); }},
      {"infless-ka",
       "INFless-KA: native GPU containers bound to one GPU, kept alive for 60 s after their last "
       "request, cold-started (8-11 s) when a request finds none; no swapping. Its 0% is the "
       "baseline's behaviour at this load, not a setup error: the seeds runs configure it as "
       "Fig. 10 does (same node, 32 GiB GPUs, 60 s keep-alive, time scale), where it already "
       "falls to 18% at 100 functions and 0% from 120. The four GPUs hold about 78 native "
       "containers at once (Native executes 79 at 160), so at 560 functions an idle container "
       "is reclaimed for another function's cold start long before its keep-alive ends (600 s "
       "instead of 60 changes nothing). In seed 1, under Poisson, 1,230 of 71,758 requests find "
       "their container up; the rest wait for one of 6,046 cold starts, each then serving the "
       "dozen requests queued behind it, a mean wait of 34 s and a p99 of about 70 s against "
       "80-200 ms deadlines.",
       [](const O& o) { return early_system(o, "infless-ka", EarlyBinding::kInflessKeepAlive); }},
  };
  return configs;
}

Result<const SeedsConfig*> find_seeds_config(std::string_view name) {
  std::string known;
  for (const SeedsConfig& c : seeds_configs()) {
    if (c.name == name) return &c;
    known += str_cat(known.empty() ? "" : ", ", c.name);
  }
  return error(ErrorCode::kInvalidValue, "unknown configuration '", name, "' (known: ", known, ")");
}

std::string default_seeds_policies() {
  std::string out;
  for (const SeedsConfig& c : seeds_configs()) out += str_cat(out.empty() ? "" : ",", c.name);
  return out;
}

Result<ExperimentResult> experiment_seeds(const ExperimentOptions& options) {
  if (options.seeds < 1) return error(ErrorCode::kInvalidValue, "seeds must be >= 1");
  std::vector<const SeedsConfig*> configs;
  std::string_view rest = options.policies.empty() ? std::string_view() : options.policies;
  const std::string defaults = default_seeds_policies();
  if (rest.empty()) rest = defaults;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    HIBER_ASSIGN_OR_RETURN(const SeedsConfig* c, find_seeds_config(rest.substr(0, comma)));
    configs.push_back(c);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  const NodeConfig node = with_gpu_memory(options.node, options.gpu_memory_bytes);
  const std::vector<ArrivalPattern> patterns = {ArrivalPattern::kPoisson, ArrivalPattern::kAzure};
  const char* pattern_names[] = {"poisson", "azure"};
  std::vector<std::function<Result<RunOutput>()>> jobs;
  for (const SeedsConfig* c : configs) {
    for (ArrivalPattern pattern : patterns) {
      for (int k = 0; k < options.seeds; ++k) {
        const uint64_t seed = options.seed + k;
        jobs.push_back([&options, &node, c, pattern, seed]() -> Result<RunOutput> {
          ExperimentOptions o = options;
          o.seed = seed;
          SystemSpec system = c->make(o);
          const ExecVariation exec{kVisionCv, kLanguageCv, seed};
          system.hiber.exec_variation = exec;
          system.early.exec_variation = exec;
          SyntheticOptions w = paper_workload(o, kFunctions, kMeasured);
          w.pattern = pattern;
          HIBER_ASSIGN_OR_RETURN(Workload workload, synthetic_workload(w));
          RunConfig run;
          run.node = node;
          return simulate(system, run, workload);
        });
      }
    }
  }
  std::vector<Result<RunOutput>> results = run_all(jobs, options.threads);
  HIBER_RETURN_IF_ERROR(first_error(results));

  ExperimentResult out;
  CsvTable runs_csv({"config", "arrivals", "seed", "compliant_pct", "worst_model",
                     "worst_model_pct", "rejected", "failed", "unfinished", "p99_ms"});
  CsvTable table_csv({"config", "arrivals", "seeds", "compliant_mean", "compliant_sd",
                      "compliant_min", "compliant_max", "worst_model", "worst_model_mean_pct",
                      "worst_model_min_pct", "lowest_seed_model", "lowest_seed_pct",
                      "rejected_per_run", "failed_per_run", "unfinished_per_run", "p99_ms",
                      "goal_mean_90", "goal_class_50", "goal_class_50_every_seed"});
  std::vector<SeedsRow> rows;
  size_t j = 0;
  for (const SeedsConfig* c : configs) {
    for (size_t p = 0; p < patterns.size(); ++p) {
      std::vector<Results> per_seed;
      for (int k = 0; k < options.seeds; ++k, ++j) {
        per_seed.push_back(results[j]->results);
        const SeedsRow one =
            summarize_seeds(std::string(c->name), pattern_names[p], {per_seed.back()});
        runs_csv.add({one.config, one.arrivals, std::to_string(options.seed + k),
                      fmt(one.compliant_pct.mean, 2), one.lowest_seed_model,
                      fmt(one.lowest_seed_pct, 2), fmt(one.rejected, 0), fmt(one.failed, 0),
                      fmt(one.unfinished, 0), fmt(one.p99_ms, 1)});
      }
      rows.push_back(summarize_seeds(std::string(c->name), pattern_names[p], per_seed));
    }
  }
  std::vector<std::vector<std::string>> md;
  for (const SeedsRow& r : rows) {
    table_csv.add({r.config, r.arrivals, std::to_string(r.seeds), fmt(r.compliant_pct.mean, 2),
                   fmt(r.compliant_pct.sd, 2), fmt(r.compliant_pct.min, 2),
                   fmt(r.compliant_pct.max, 2), r.worst_model, fmt(r.worst_model_pct, 2),
                   fmt(r.worst_model_min_pct, 2), r.lowest_seed_model, fmt(r.lowest_seed_pct, 2),
                   fmt(r.rejected, 1), fmt(r.failed, 1), fmt(r.unfinished, 1), fmt(r.p99_ms, 1),
                   yes_no(meets_mean_goal(r)), yes_no(meets_class_goal(r)),
                   yes_no(meets_class_goal_every_seed(r))});
    md.push_back({r.config, r.arrivals,
                  str_cat(fmt(r.compliant_pct.mean, 1), " ± ", fmt(r.compliant_pct.sd, 1)),
                  str_cat(fmt(r.compliant_pct.min, 1), "-", fmt(r.compliant_pct.max, 1)),
                  str_cat(r.worst_model, " ", fmt(r.worst_model_pct, 1), " (worst seed ",
                          fmt(r.worst_model_min_pct, 0), ")"),
                  str_cat(r.lowest_seed_model, " ", fmt(r.lowest_seed_pct, 0)), fmt(r.rejected, 0),
                  fmt(r.failed, 0), fmt(r.unfinished, 0), fmt_ms(r.p99_ms),
                  yes_no(meets_mean_goal(r)),
                  str_cat(yes_no(meets_class_goal(r)),
                          " (every seed: ", yes_no(meets_class_goal_every_seed(r)), ")")});
  }
  HIBER_RETURN_IF_ERROR(table_csv.write(file_in(options, "seeds.csv")));
  HIBER_RETURN_IF_ERROR(runs_csv.write(file_in(options, "seeds_runs.csv")));
  out.files = {"seeds.csv", "seeds_runs.csv"};

  // Where the first configuration (Hiber's default when listed first) still loses.
  std::string mechanisms, losses;
  for (const SeedsConfig* c : configs)
    mechanisms += str_cat("- **", c->name, "**: ", c->mechanism, "\n");
  const std::string& base = rows.front().config;
  for (size_t p = 0; p < patterns.size(); ++p) {
    const SeedsRow& b = rows[p];
    for (size_t i = patterns.size() + p; i < rows.size(); i += patterns.size()) {
      const SeedsRow& r = rows[i];
      if (r.compliant_pct.mean > b.compliant_pct.mean)
        losses += str_cat("- ", r.arrivals, ": ", r.config, " keeps more functions compliant (",
                          fmt(r.compliant_pct.mean, 1), "% against ", fmt(b.compliant_pct.mean, 1),
                          "%).\n");
      if (r.worst_model_pct > b.worst_model_pct)
        losses += str_cat("- ", r.arrivals, ": ", r.config, " treats its worst model better (",
                          r.worst_model, " ", fmt(r.worst_model_pct, 1), "% against ", b.config,
                          "'s ", b.worst_model, " ", fmt(b.worst_model_pct, 1), "%).\n");
      if (r.p99_ms < b.p99_ms)
        losses += str_cat("- ", r.arrivals, ": ", r.config, " has the shorter p99 (",
                          fmt_ms(r.p99_ms), " ms against ", fmt_ms(b.p99_ms), " ms).\n");
    }
    if (!meets_class_goal(b))
      losses += str_cat("- ", b.arrivals, ": ", base, " leaves ", b.worst_model, " at ",
                        fmt(b.worst_model_pct, 1),
                        "% compliant on average, below the 50% every model class should reach.\n");
    else if (!meets_class_goal_every_seed(b))
      losses += str_cat("- ", b.arrivals, ": ", base,
                        " keeps every class at 50% or more on average, but not in every seed: ",
                        b.lowest_seed_model, " falls to ", fmt(b.lowest_seed_pct, 1),
                        "% in its worst seed.\n");
    if (!meets_mean_goal(b))
      losses += str_cat("- ", b.arrivals, ": ", base, " averages ", fmt(b.compliant_pct.mean, 1),
                        "%, short of the 90% goal (issue 20).\n");
    // Shedding's price, stated even where nothing beats it.
    if (b.rejected > 0)
      losses += str_cat("- ", b.arrivals, ": ", base, " answers ", fmt(b.rejected, 0),
                        " requests per run \"overloaded\" without running them (mean over the "
                        "seeds): misses by design, counted in its compliance.\n");
  }
  if (losses.empty()) losses = "- Nowhere in this table.\n";

  HIBER_ASSIGN_OR_RETURN(Workload sample,
                         synthetic_workload(paper_workload(options, kFunctions, kMeasured)));
  const SeedsRow& h0 = rows[0];
  const SeedsRow& h1 = rows[1];
  out.paper = "(not in the paper) one seed, Poisson arrivals, fixed execution times";
  out.ours = str_cat(base, " over ", options.seeds, " seeds: poisson ",
                     fmt(h0.compliant_pct.mean, 1), " ± ", fmt(h0.compliant_pct.sd, 1), "%, azure ",
                     fmt(h1.compliant_pct.mean, 1), " ± ", fmt(h1.compliant_pct.sd, 1), "%");
  out.markdown = str_cat(
      "## Seeds and arrivals: every configuration over ", options.seeds, " seeds\n\n",
      "Setup: Fig. 11's node and its ", kFunctions, "-function point (10 measured minutes), seeds ",
      options.seed, "..", options.seed + options.seeds - 1,
      " (the workload's and the policies'), under Poisson arrivals and under Azure-shaped "
      "ones (`--pattern=azure`: per-minute counts with the trace's burstiness at the same mean "
      "rate, docs/sim.md). Execution times vary per request (log-normal, CV ",
      fmt(100 * kVisionCv, 0), "% for the CNNs and ", fmt(100 * kLanguageCv, 0),
      "% for Bert-qa, an assumption: sim/exec_variation.h); the paper's figures above keep "
      "Table 4's fixed times. Command: `",
      command_line("seeds"),
      "` (`--policies=a,b,c` picks the configurations, `--seeds=N` the "
      "count).\n\n"
      "Columns: SLO-compliant functions as mean ± standard deviation and range over the seeds; "
      "the lowest model class (the class whose functions comply least, as the mean over the "
      "seeds, and that class's worst seed); the lowest share of any class in any single seed; "
      "per run, the requests rejected without running (shed and answered \"overloaded\" by "
      "`--shed`; early binding never refuses under INFless-KA), the start failures (started, "
      "could not finish) and those still unfinished at the end; the p99 latency over all "
      "requests, mean over seeds (inf when more than 1% of some run's requests never finished). "
      "A rejected request is a miss: it counts against its function's compliance as a late "
      "completion would.\n\n"
      "Issue 20's goals, judged per row in the last two columns: at least ",
      fmt(kGoalCompliantPct, 0),
      "% of functions compliant as the mean over the seeds, and at "
      "least ",
      fmt(kGoalClassPct, 0),
      "% of the functions of every model class compliant (as the lowest class's mean over "
      "the seeds; \"every seed\" is the stricter reading, the lowest class in each run).\n\n",
      markdown_table(
          {"configuration", "arrivals", "compliant % (mean ± sd)", "range",
           "lowest class % (worst seed)", "lowest class in any seed", "rejected (overloaded)",
           "start failures", "unfinished", "p99 (ms)", ">= 90% mean", "every class >= 50%"},
          md),
      "\nThe configurations:\n\n", mechanisms, "\nWhere ", base, " still loses:\n\n", losses,
      "\nThe arrivals' burstiness over a day per function, at the rates of the ", kFunctions,
      " functions (quartiles across functions):\n\n", arrival_statistics(sample, options.seed),
      "\n");
  return out;
}

}  // namespace hiber::sim
