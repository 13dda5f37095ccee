#include "mrc_plot.hpp"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tier/json.hpp"

extern char** environ;

namespace tier::cli {
namespace {

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

// A round step for about `ticks` ticks over [0, span]: 1, 2 or 5 times a power of ten.
double nice_step(double span, int ticks) {
  const double raw = span / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string svg_text(const PlotData& d) {
  constexpr double kW = 760, kH = 480, kLeft = 80, kRight = 30, kTop = 50, kBottom = 60;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  const double xmax = std::max<double>(1, static_cast<double>(d.curve.back().blocks));
  auto x = [&](double blocks) { return kLeft + pw * blocks / xmax; };
  auto y = [&](double miss) { return kTop + ph * (1 - miss); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      kW, kH);
  const std::string title =
      d.error > 0 ? fmt::format("{} (sampled: +/-{:.3f})", d.title, d.error) : d.title;
  s += fmt::format("<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                   kW / 2, xml_escape(title));
  // Grid and ticks: miss ratio 0..1 by 0.1, capacity by a round step.
  for (int i = 0; i <= 10; ++i) {
    const double v = i / 10.0;
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:.1f}</text>\n",
        kLeft, y(v), kLeft + pw, kLeft - 6, y(v) + 4, v);
  }
  const double step = nice_step(xmax, 6);
  for (double v = 0; v <= xmax * 1.0001; v += step)
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x(v), kTop, kTop + ph, kTop + ph + 18, static_cast<std::uint64_t>(v));
  s += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n",
      kLeft, kTop, pw, ph);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", kLeft + pw / 2,
                   kH - 16, xml_escape(d.x_label));
  s += fmt::format(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">"
      "miss ratio</text>\n",
      kTop + ph / 2);
  // The curve, a step function: horizontal to each point, then down to its ratio.
  std::string points;
  double last = d.curve.front().miss_ratio;
  for (const PlotPoint& p : d.curve) {
    points += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", x(static_cast<double>(p.blocks)), y(last),
                          x(static_cast<double>(p.blocks)), y(p.miss_ratio));
    last = p.miss_ratio;
  }
  s += fmt::format(
      "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>\n", points);
  auto mark = [&](const PlotPoint& p, const char* color, const std::string& label) {
    const double px = x(static_cast<double>(p.blocks)), py = y(p.miss_ratio);
    s += fmt::format(
        "<circle cx=\"{0:.1f}\" cy=\"{1:.1f}\" r=\"5\" fill=\"{2}\"/>"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" fill=\"{2}\">{5}</text>\n",
        px, py, color, px + 8, py - 8, xml_escape(label));
  };
  if (d.knee)
    mark(*d.knee, "#d62728",
         fmt::format("knee: {} blocks, miss {:.3f}", d.knee->blocks, d.knee->miss_ratio));
  if (d.at)
    mark(*d.at, "#2ca02c", fmt::format("{} blocks: miss {:.3f}", d.at->blocks, d.at->miss_ratio));
  s += "</svg>\n";
  return s;
}

Json plot_json(const PlotData& d) {
  Json curve_blocks = Json::array(), curve_miss = Json::array();
  for (const PlotPoint& p : d.curve) {
    curve_blocks.push_back(p.blocks);
    curve_miss.push_back(p.miss_ratio);
  }
  auto point = [](const std::optional<PlotPoint>& p) {
    return p ? Json{{"blocks", p->blocks}, {"miss_ratio", p->miss_ratio}} : Json();
  };
  return {{"title", d.title},         {"x_label", d.x_label},  {"blocks", curve_blocks},
          {"miss_ratio", curve_miss}, {"knee", point(d.knee)}, {"at", point(d.at)},
          {"error", d.error}};
}

// plot_mrc.py beside this program (the build tree), else in ../share/libtier (installed).
Result<std::string> plot_script() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return Status::not_found("cannot find this program's path: " + ec.message());
  for (const auto& candidate :
       {exe.parent_path() / "plot_mrc.py",
        exe.parent_path().parent_path() / "share" / "libtier" / "plot_mrc.py"})
    if (std::filesystem::is_regular_file(candidate, ec)) return candidate.string();
  return Status::not_found(
      fmt::format("plot_mrc.py is neither beside {} nor in ../share/libtier", exe.string()));
}

// Runs `PYTHON SCRIPT ARG` with `input` on its stdin; returns its exit status (127: PYTHON
// could not be started). SIGPIPE is ignored here (a script that dies early is an exit code, not
// a signal) and restored to the default in the child.
Result<int> run_script(const std::string& python, const std::string& script, const std::string& arg,
                       const std::string& input) {
  int fds[2];
  if (pipe(fds) != 0) return Status::io_error(fmt::format("pipe: {}", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  std::vector<std::string> words = {python, script, arg};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, python.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[0]);
  if (rc != 0) {
    close(fds[1]);
    return 127;
  }
  std::signal(SIGPIPE, SIG_IGN);
  for (std::size_t done = 0; done < input.size();) {
    const ssize_t n = write(fds[1], input.data() + done, input.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the script stopped reading: its exit status says why
    done += static_cast<std::size_t>(n);
  }
  close(fds[1]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

constexpr int kNoMatplotlib = 3;  // plot_mrc.py's exit status when matplotlib is missing

}  // namespace

Result<Plotter> find_plotter(const std::string& path) {
  const std::string ext = lower_extension(path);
  if (ext == ".svg") return Plotter{PlotFormat::kSvg, "", ""};
  if (ext != ".png")
    return Status::invalid(fmt::format(
        "--plot {}: unknown plot format \"{}\"; the file must end in .svg or .png", path, ext));
  TIER_ASSIGN_OR_RETURN(std::string script, plot_script());
  std::string tried;
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    TIER_ASSIGN_OR_RETURN(int rc, run_script(python, script, "--check", ""));
    if (rc == 0) return Plotter{PlotFormat::kPng, python, script};
    tried += fmt::format("{}{}: {}", tried.empty() ? "" : "; ", python,
                         rc == 127             ? "not found"
                         : rc == kNoMatplotlib ? "no matplotlib"
                                               : fmt::format("exit status {}", rc));
  }
  return Status::not_found(fmt::format(
      "a PNG plot needs matplotlib (apt-get install python3-matplotlib), or plot to an .svg "
      "file ({})",
      tried));
}

Status write_plot(const std::string& path, const Plotter& plotter, const PlotData& data) {
  if (data.curve.empty()) return Status::invalid("no curve to plot");
  if (plotter.format == PlotFormat::kPng) {
    TIER_ASSIGN_OR_RETURN(
        int rc, run_script(plotter.python, plotter.script, path, tier::json_text(plot_json(data))));
    if (rc != 0)
      return Status::io_error(
          fmt::format("{} {} failed (exit status {})", plotter.python, plotter.script, rc));
    return Status::ok();
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << svg_text(data);
  out.close();
  if (!out)
    return Status::io_error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
  return Status::ok();
}

}  // namespace tier::cli
