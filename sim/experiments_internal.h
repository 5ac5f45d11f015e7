// The experiments' entry points, one per file group (experiments.cc dispatches by name).
#pragma once

#include "sim/experiments.h"

namespace hiber::sim {

Result<ExperimentResult> experiment_calibration(const ExperimentOptions& options);
Result<ExperimentResult> experiment_fig10(const ExperimentOptions& options);
Result<ExperimentResult> experiment_fig11(const ExperimentOptions& options);
Result<ExperimentResult> experiment_fig12(const ExperimentOptions& options);
Result<ExperimentResult> experiment_fig14(const ExperimentOptions& options);
Result<ExperimentResult> experiment_caching(const ExperimentOptions& options);
Result<ExperimentResult> experiment_queue(const ExperimentOptions& options);
Result<ExperimentResult> experiment_seeds(const ExperimentOptions& options);

}  // namespace hiber::sim
