// `lstm plot`: a run's metrics.jsonl rasterised into a PNG (no plotting or image library).
#include "lstm/plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config_reader.hpp"
#include "io/png.hpp"
#include "lstm/error.hpp"
#include "lstm/safetensors.hpp"

namespace lstm {

namespace {

// 5x7 capitals, digits and the punctuation tick labels and titles need; '#' is ink. Lower-case
// text is drawn in capitals.
struct Glyph {
  char c;
  const char* rows;  // 7 rows of 5
};
constexpr Glyph kFont[] = {
    {'A', ".###." "#...#" "#...#" "#####" "#...#" "#...#" "#...#"},
    {'B', "####." "#...#" "#...#" "####." "#...#" "#...#" "####."},
    {'C', ".###." "#...#" "#...." "#...." "#...." "#...#" ".###."},
    {'D', "####." "#...#" "#...#" "#...#" "#...#" "#...#" "####."},
    {'E', "#####" "#...." "#...." "####." "#...." "#...." "#####"},
    {'F', "#####" "#...." "#...." "####." "#...." "#...." "#...."},
    {'G', ".###." "#...#" "#...." "#.###" "#...#" "#...#" ".####"},
    {'H', "#...#" "#...#" "#...#" "#####" "#...#" "#...#" "#...#"},
    {'I', ".###." "..#.." "..#.." "..#.." "..#.." "..#.." ".###."},
    {'J', "..###" "...#." "...#." "...#." "...#." "#..#." ".##.."},
    {'K', "#...#" "#..#." "#.#.." "##..." "#.#.." "#..#." "#...#"},
    {'L', "#...." "#...." "#...." "#...." "#...." "#...." "#####"},
    {'M', "#...#" "##.##" "#.#.#" "#.#.#" "#...#" "#...#" "#...#"},
    {'N', "#...#" "#...#" "##..#" "#.#.#" "#..##" "#...#" "#...#"},
    {'O', ".###." "#...#" "#...#" "#...#" "#...#" "#...#" ".###."},
    {'P', "####." "#...#" "#...#" "####." "#...." "#...." "#...."},
    {'Q', ".###." "#...#" "#...#" "#...#" "#.#.#" "#..#." ".##.#"},
    {'R', "####." "#...#" "#...#" "####." "#.#.." "#..#." "#...#"},
    {'S', ".####" "#...." "#...." ".###." "....#" "....#" "####."},
    {'T', "#####" "..#.." "..#.." "..#.." "..#.." "..#.." "..#.."},
    {'U', "#...#" "#...#" "#...#" "#...#" "#...#" "#...#" ".###."},
    {'V', "#...#" "#...#" "#...#" "#...#" "#...#" ".#.#." "..#.."},
    {'W', "#...#" "#...#" "#...#" "#.#.#" "#.#.#" "#.#.#" ".#.#."},
    {'X', "#...#" "#...#" ".#.#." "..#.." ".#.#." "#...#" "#...#"},
    {'Y', "#...#" "#...#" ".#.#." "..#.." "..#.." "..#.." "..#.."},
    {'Z', "#####" "....#" "...#." "..#.." ".#..." "#...." "#####"},
    {'0', ".###." "#...#" "#..##" "#.#.#" "##..#" "#...#" ".###."},
    {'1', "..#.." ".##.." "..#.." "..#.." "..#.." "..#.." ".###."},
    {'2', ".###." "#...#" "....#" "...#." "..#.." ".#..." "#####"},
    {'3', "#####" "...#." "..#.." "...#." "....#" "#...#" ".###."},
    {'4', "...#." "..##." ".#.#." "#..#." "#####" "...#." "...#."},
    {'5', "#####" "#...." "####." "....#" "....#" "#...#" ".###."},
    {'6', "..##." ".#..." "#...." "####." "#...#" "#...#" ".###."},
    {'7', "#####" "....#" "...#." "..#.." ".#..." ".#..." ".#..."},
    {'8', ".###." "#...#" "#...#" ".###." "#...#" "#...#" ".###."},
    {'9', ".###." "#...#" "#...#" ".####" "....#" "...#." ".##.."},
    {'.', "....." "....." "....." "....." "....." ".##.." ".##.."},
    {',', "....." "....." "....." "....." ".##.." "..#.." ".#..."},
    {'-', "....." "....." "....." "#####" "....." "....." "....."},
    {'+', "....." "..#.." "..#.." "#####" "..#.." "..#.." "....."},
    {'%', "##..." "##..#" "...#." "..#.." ".#..." "#..##" "...##"},
    {'(', "...#." "..#.." ".#..." ".#..." ".#..." "..#.." "...#."},
    {')', ".#..." "..#.." "...#." "...#." "...#." "..#.." ".#..."},
    {':', "....." ".##.." ".##.." "....." ".##.." ".##.." "....."},
    {'/', "....." "....#" "...#." "..#.." ".#..." "#...." "....."},
    {'_', "....." "....." "....." "....." "....." "....." "#####"},
    {'=', "....." "....." "#####" "....." "#####" "....." "....."},
};

const char* glyph(char c) {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  for (const Glyph& g : kFont)
    if (g.c == c) return g.rows;
  return nullptr;  // space and anything unknown: blank
}

// Palette indices; kPalette holds their colours (the curve colours are plot.hpp's).
enum Colour : uint8_t { kWhite, kInk, kGrid, kAxis, kTrain, kValid, kAccuracy, kLr, kNorm };
const std::vector<Rgb> kPalette = {{255, 255, 255}, {34, 34, 34},   {225, 225, 225}, {120, 120, 120}, {31, 119, 180},
                                   {255, 127, 14},  {44, 160, 44},  {148, 103, 189}, {214, 39, 40}};

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * h, kWhite) {}
  void set(int x, int y, uint8_t c) {
    if (x >= 0 && y >= 0 && x < w_ && y < h_) px_[static_cast<size_t>(y) * w_ + x] = c;
  }
  void fill(int x0, int y0, int x1, int y1, uint8_t c) {  // inclusive corners
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) set(x, y, c);
  }
  // Bresenham, `thick` pixels wide (a square brush).
  void line(int x0, int y0, int x1, int y1, uint8_t c, int thick = 1) {
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      fill(x0 - (thick - 1) / 2, y0 - (thick - 1) / 2, x0 + thick / 2, y0 + thick / 2, c);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  static int text_width(const std::string& s, int scale = 1) { return static_cast<int>(s.size()) * 6 * scale - scale; }
  void text(int x, int y, const std::string& s, uint8_t c, int scale = 1) {
    for (char ch : s) {
      if (const char* g = glyph(ch))
        for (int r = 0; r < 7; ++r)
          for (int k = 0; k < 5; ++k)
            if (g[r * 5 + k] == '#') fill(x + k * scale, y + r * scale, x + k * scale + scale - 1, y + r * scale + scale - 1, c);
      x += 6 * scale;
    }
  }
  std::string png() const { return encode_png_indexed(w_, h_, kPalette, px_); }

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

// About `n` round tick values (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int n, double& step) {
  const double raw = (hi - lo) / std::max(1, n);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  step = mag * (raw / mag < 1.5 ? 1 : raw / mag < 3.5 ? 2 : raw / mag < 7.5 ? 5 : 10);
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  return t;
}

// `sci`: the axis's ticks are all tiny or huge, so each is written as 3E-4.
std::string tick_label(double v, double step, bool sci) {
  char buf[32];
  if (v != 0 && sci) {
    std::snprintf(buf, sizeof buf, "%.1e", v);  // 3.0e-04 -> 3.0E-4
    std::string s = buf;
    const size_t e = s.find('e');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    if (mant.size() > 2 && mant.substr(mant.size() - 2) == ".0") mant.resize(mant.size() - 2);
    const bool neg = ex[0] == '-';
    ex = ex.substr(1);
    while (ex.size() > 1 && ex[0] == '0') ex.erase(0, 1);
    return mant + "E" + (neg ? "-" : "") + ex;
  }
  const int decimals = step >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

struct Series {
  std::vector<std::pair<double, double>> pts;  // (step, value), finite values only
  uint8_t colour;
  std::string label;
  bool markers = false;
};

// One panel in the box (x, y, w, h): title, legend, grid, ticks, curves.
// `best_step` >= 0: a dashed line marks the step of the best model.
void draw_panel(Canvas& cv, int x, int y, int w, int h, const std::string& title, const std::vector<Series>& series,
                double max_step, double best_step = -1) {
  cv.text(x + 48, y + 6, title, kInk, 2);
  int lx = x + 48 + Canvas::text_width(title, 2) + 16;
  if (series.size() > 1)
    for (const Series& s : series) {
      cv.fill(lx, y + 12, lx + 12, y + 13, s.colour);
      cv.text(lx + 16, y + 9, s.label, s.colour);
      lx += 16 + Canvas::text_width(s.label) + 14;
    }
  const int left = x + 50, right = x + w - 14, top = y + 30, bottom = y + h - 30;
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  for (const Series& s : series)
    for (auto [sx, v] : s.pts) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) {
    cv.text(left + 10, (top + bottom) / 2, "NO DATA YET", kAxis);
    lo = 0, hi = 1;
  }
  if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {
    const double pad = std::abs(hi) > 0 ? std::abs(hi) * 0.1 : 1;
    lo -= pad, hi += pad;
  }
  const double pad = (hi - lo) * 0.05;
  lo -= pad, hi += pad;
  const double x_hi = std::max(1.0, max_step);
  auto px = [&](double s) { return left + static_cast<int>(std::lround((right - left) * s / x_hi)); };
  auto py = [&](double v) { return bottom - static_cast<int>(std::lround((bottom - top) * (v - lo) / (hi - lo))); };
  double ystep = 0, xstep = 0;
  const std::vector<double> yticks = nice_ticks(lo, hi, 5, ystep);
  double ymax = 0;
  for (double t : yticks) ymax = std::max(ymax, std::abs(t));
  for (double t : yticks) {
    cv.line(left, py(t), right, py(t), kGrid);
    const std::string l = tick_label(t, ystep, ymax < 1e-3 || ymax >= 1e6);
    cv.text(left - 4 - Canvas::text_width(l), py(t) - 3, l, kInk);
  }
  for (double t : nice_ticks(0, x_hi, 5, xstep)) {
    cv.line(px(t), top, px(t), bottom, kGrid);
    const std::string l = tick_label(t, xstep, x_hi >= 1e6);
    cv.text(px(t) - Canvas::text_width(l) / 2, bottom + 5, l, kInk);
  }
  cv.text(right - Canvas::text_width("STEP"), bottom + 16, "STEP", kAxis);
  cv.line(left, top, left, bottom, kAxis);
  cv.line(left, bottom, right, bottom, kAxis);
  if (best_step >= 0) {
    for (int yy = top; yy < bottom; yy += 6) cv.line(px(best_step), yy, px(best_step), std::min(bottom, yy + 2), kInk);
    const int tx = std::min(px(best_step) + 4, right - Canvas::text_width("BEST"));
    cv.text(tx, top + 2, "BEST", kInk);
  }
  for (const Series& s : series) {
    for (size_t i = 1; i < s.pts.size(); ++i)
      cv.line(px(s.pts[i - 1].first), py(s.pts[i - 1].second), px(s.pts[i].first), py(s.pts[i].second), s.colour, 2);
    if (s.markers || s.pts.size() == 1)
      for (auto [sx, v] : s.pts) cv.fill(px(sx) - 2, py(v) - 2, px(sx) + 2, py(v) + 2, s.colour);
  }
}

void add(Series& s, const nlohmann::json& rec, const char* key) {
  auto it = rec.find(key);
  if (it != rec.end() && it->is_number() && rec["step"].is_number()) {
    const double v = it->get<double>();
    if (std::isfinite(v)) s.pts.emplace_back(rec["step"].get<double>(), v);
  }
}

}  // namespace

PlotResult plot_run(const std::string& run_dir, const std::string& png_path, int width, int height) {
  LSTM_REQUIRE(width >= 400 && width <= 8000 && height >= 300 && height <= 8000,
               "plot size must be in [400, 8000] x [300, 8000], got " << width << " x " << height);
  const std::string path = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  LSTM_REQUIRE(std::filesystem::exists(path),
               path << " does not exist: lstm train writes it into the run folder (give the run's --out folder)");
  const std::string text = read_regular_file(path, path + ": ", memory_limited_bytes());
  PlotResult r;
  Series train{{}, kTrain, "TRAIN"}, valid{{}, kValid, "VALID", true}, acc{{}, kAccuracy, "VALID", true},
      lr{{}, kLr, "LR"}, norm{{}, kNorm, "NORM"};
  double max_step = 0, best_step = -1;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded() || !rec.is_object() || !rec.contains("step") || !rec["step"].is_number() ||
        !rec.contains("kind")) {
      ++r.skipped_lines;
      continue;
    }
    max_step = std::max(max_step, rec["step"].get<double>());
    if (rec["kind"] == "train") {
      ++r.train_records;
      add(train, rec, "loss");
      add(lr, rec, "lr");
      add(norm, rec, "grad_norm");
    } else if (rec["kind"] == "eval") {
      ++r.eval_records;
      add(valid, rec, "valid_loss");
      add(acc, rec, "valid_accuracy");
      if (rec.contains("best_step") && rec["best_step"].is_number() && rec["best_step"].get<double>() >= 0)
        best_step = rec["best_step"].get<double>();
    }
  }
  LSTM_REQUIRE(r.train_records > 0, path << ": no \"train\" record yet (the run logs one every train.log_every steps)");
  for (auto& p : acc.pts) p.second *= 100;
  Canvas cv(width, height);
  const int hw = width / 2, hh = height / 2;
  draw_panel(cv, 0, 0, hw, hh, "LOSS", {train, valid}, max_step, best_step);
  draw_panel(cv, hw, 0, width - hw, hh, "VALID ACCURACY %", {acc}, max_step, best_step);
  draw_panel(cv, 0, hh, hw, height - hh, "LEARNING RATE", {lr}, max_step);
  draw_panel(cv, hw, hh, width - hw, height - hh, "GRADIENT NORM", {norm}, max_step);
  write_file_atomic(png_path, cv.png());
  r.width = width;
  r.height = height;
  return r;
}

}  // namespace lstm
