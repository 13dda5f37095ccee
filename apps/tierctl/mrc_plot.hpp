#pragma once
// Miss-ratio curve plots for `tierctl size --plot FILE`: SVG written here, PNG by
// plot_mrc.py (Debian's python3-matplotlib), chosen by the file's extension.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tier/status.hpp"

namespace tier::cli {

struct PlotPoint {
  std::uint64_t blocks;
  double miss_ratio;
};

struct PlotData {
  std::string title;
  std::string x_label;
  std::vector<PlotPoint> curve;   // in increasing capacity, the first at 0 blocks
  std::optional<PlotPoint> knee;  // marked and labelled
  std::optional<PlotPoint> at;    // --at, marked and labelled
  double error = 0;               // sampled: the largest stated error (a note in the title)
};

enum class PlotFormat { kSvg, kPng };

// How a plot is drawn: SVG here; PNG by plot_mrc.py under a Python that imports matplotlib.
struct Plotter {
  PlotFormat format;
  std::string python;  // PNG: "python3" from PATH, else Debian's /usr/bin/python3
  std::string script;  // PNG: plot_mrc.py beside this program, else in ../share/libtier
};

// The plotter for `path`, found before any work: the format from the extension (.svg or .png,
// any case); for PNG, the first of python3 (PATH) and /usr/bin/python3 that imports
// matplotlib. Errors: InvalidArgument (another extension), NotFound (no such Python or no
// script; the message says what to install).
Result<Plotter> find_plotter(const std::string& path);

// Writes the plot. Errors: IoError (the file cannot be written, or the script failed: its
// stderr is passed through).
Status write_plot(const std::string& path, const Plotter& plotter, const PlotData& data);

}  // namespace tier::cli
