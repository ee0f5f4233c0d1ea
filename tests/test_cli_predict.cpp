// End-to-end tests of `lstm predict` and `lstm eval` on files of the user's: streaming in chunks,
// the output formats, <unk>, unknown classes, per-class metrics, and one validation loss for
// training and eval. Two tiny models are trained once (threads 1, a second or so each).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/csv_reader.hpp"
#include "lstm/safetensors.hpp"
#include "test_util.hpp"

using namespace lstm;
using lstm::testing::CliRun;
using lstm::testing::run_cli;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// The CLI's stdout lines before any "lstm predict:" note on stderr.
std::vector<CsvRecord> csv_of(const std::string& out) {
  std::string body;
  std::istringstream is(out);
  for (std::string line; std::getline(is, line);)
    if (line.rfind("lstm predict:", 0) != 0) body += line + "\n";
  return parse_csv(body, "stdout");
}

// The number after `key` in `text` (e.g. "final validation loss 0.3321").
double number_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return NAN;
  return std::stod(text.substr(at + key.size()));
}

nlohmann::json json_of(const std::string& out) {
  const size_t start = out.find('{');
  return start == std::string::npos ? nlohmann::json() : nlohmann::json::parse(out.substr(start));
}

class PredictCli : public ::testing::Test {
 protected:
  static inline fs::path dir;
  static inline std::string classify_train_out, charlm_train_out;

  static void SetUpTestSuite() {
    dir = lstm::testing::temp_dir("lstm_cli_predict", "suite");
    lstm::testing::write_majority_csv(dir / "train.csv", 200, 3);
    // 60 held-out rows in 4 batches of 16; the periodic estimate reads 1 of them.
    nlohmann::json cls = {
        {"task", "classify"},
        {"data", {{"path", (dir / "train.csv").string()}, {"valid_fraction", 0.3}}},
        {"model",
         {{"embedding_dim", 8},
          {"layers", {{{"type", "lstm"}, {"hidden_size", 16}, {"output", "h_n"}}, {{"type", "dense"}}}}}},
        {"train",
         {{"steps", 40}, {"batch_size", 16}, {"eval_every", 20}, {"eval_batches", 1}, {"log_every", 20},
          {"checkpoint_every", 0}}}};
    write_text(dir / "cls.json", cls.dump());
    classify_train_out = run_cli("train --threads 1 --config " + (dir / "cls.json").string() + " --out " +
                                 (dir / "cls").string()).out;
    std::string text;
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"};
    Rng rng(5);
    for (int i = 0; i < 120; ++i) {
      for (int w = 0; w < 5; ++w) text += std::string(w ? " " : "") + words[rng.below(9)];
      text += "\n";
    }
    write_text(dir / "text.txt", text);
    nlohmann::json lm = {
        {"task", "charlm"},
        {"data", {{"path", (dir / "text.txt").string()}, {"valid_fraction", 0.2}}},
        {"model", {{"embedding_dim", 8}, {"layers", {{{"type", "lstm"}, {"hidden_size", 16}}, {{"type", "dense"}}}}}},
        {"train",
         {{"steps", 30}, {"batch_size", 8}, {"seq_len", 16}, {"eval_every", 15}, {"eval_batches", 1},
          {"log_every", 15}, {"checkpoint_every", 0}, {"sample_length", 0}}}};
    write_text(dir / "lm.json", lm.dump());
    charlm_train_out = run_cli("train --threads 1 --config " + (dir / "lm.json").string() + " --out " +
                               (dir / "lm").string()).out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }

  void SetUp() override {
    ASSERT_THAT(classify_train_out, HasSubstr("final validation loss")) << classify_train_out;
    ASSERT_THAT(charlm_train_out, HasSubstr("final validation loss")) << charlm_train_out;
  }
  static std::string cls() { return (dir / "cls").string(); }
  static std::string lm() { return (dir / "lm").string(); }
};

// Checks a classify CSV output: header, ids in order, probabilities sum to 1, argmax = predicted.
// Returns the probability rows.
std::vector<std::vector<double>> check_classify_csv(const std::vector<CsvRecord>& rec,
                                                    const std::vector<std::string>& ids) {
  std::vector<std::vector<double>> probs;
  EXPECT_FALSE(rec.empty());
  if (rec.empty()) return probs;
  EXPECT_EQ(rec[0].fields, (std::vector<std::string>{"id", "predicted", "p_more_a", "p_more_b"}));
  EXPECT_EQ(rec.size(), ids.size() + 1);
  const std::vector<std::string> names = {"more_a", "more_b"};
  for (size_t i = 1; i < rec.size() && i <= ids.size(); ++i) {
    const auto& f = rec[i].fields;
    EXPECT_EQ(f.size(), 4u);
    if (f.size() != 4) continue;
    EXPECT_EQ(f[0], ids[i - 1]);
    const std::vector<double> p = {std::stod(f[2]), std::stod(f[3])};
    EXPECT_NEAR(p[0] + p[1], 1.0, 1e-5) << "row " << i;
    EXPECT_EQ(f[1], names[p[1] > p[0] ? 1 : 0]) << "row " << i;
    probs.push_back(p);
  }
  return probs;
}

}  // namespace

TEST_F(PredictCli, ClassifyCsvStreamsEveryRowInOrder) {
  lstm::testing::write_majority_csv(dir / "many.csv", 41, 7);  // id column 0..40 and labels (not read)
  std::vector<std::string> ids(41);
  for (int i = 0; i < 41; ++i) ids[static_cast<size_t>(i)] = std::to_string(i);
  CliRun small = run_cli("predict --model " + cls() + " --data " + (dir / "many.csv").string() + " --batch-size 2");
  ASSERT_EQ(small.code, 0) << small.out;
  const auto p2 = check_classify_csv(csv_of(small.out), ids);
  // One chunk of all rows gives the same probabilities: chunking changes nothing but memory.
  CliRun big = run_cli("predict --model " + cls() + " --data " + (dir / "many.csv").string() + " --batch-size 64");
  ASSERT_EQ(big.code, 0) << big.out;
  const auto p64 = check_classify_csv(csv_of(big.out), ids);
  ASSERT_EQ(p2.size(), p64.size());
  for (size_t i = 0; i < p2.size(); ++i) EXPECT_NEAR(p2[i][0], p64[i][0], 1e-5) << "row " << i;
}

TEST_F(PredictCli, ClassifyJsonlToAFileParses) {
  lstm::testing::write_majority_csv(dir / "j.csv", 9, 11);
  const fs::path out = dir / "preds.jsonl";
  CliRun r = run_cli("predict --model " + cls() + " --data " + (dir / "j.csv").string() + " --batch-size 4 --output " +
                     out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("9 rows (classify) -> " + out.string() + " (jsonl)"));
  std::istringstream is(read_text(out));
  int n = 0;
  for (std::string line; std::getline(is, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["id"], std::to_string(n));
    const double a = j["probabilities"]["more_a"], b = j["probabilities"]["more_b"];
    EXPECT_NEAR(a + b, 1.0, 1e-9);
    EXPECT_EQ(j["predicted"], a >= b ? "more_a" : "more_b");
  }
  EXPECT_EQ(n, 9);
  // Nothing but the output is left in the folder (the temporary was renamed).
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_THAT(e.path().string(), ::testing::Not(HasSubstr(".tmp.")));
  // --format overrides the extension.
  CliRun csv = run_cli("predict --model " + cls() + " --data " + (dir / "j.csv").string() + " --format csv --output " +
                       (dir / "p.jsonl").string());
  ASSERT_EQ(csv.code, 0) << csv.out;
  EXPECT_EQ(read_text(dir / "p.jsonl").rfind("id,predicted,", 0), 0u);
  CliRun bad = run_cli("predict --model " + cls() + " --data " + (dir / "j.csv").string() + " --format xml");
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.out, HasSubstr("--format must be csv or jsonl, got 'xml'"));
}

TEST_F(PredictCli, RowsWithoutIdAreNumberedAndUnknownTokensAreUnk) {
  write_text(dir / "noid.csv", "sequence\na b zz\nb b\n");
  CliRun r = run_cli("predict --model " + cls() + " --data " + (dir / "noid.csv").string());
  ASSERT_EQ(r.code, 0) << r.out;
  check_classify_csv(csv_of(r.out), {"1", "2"});
  EXPECT_THAT(r.out, HasSubstr("1 input token(s) not in the model's vocabulary were read as <unk>"));
  // "zz" is read exactly as the model's own <unk> token.
  write_text(dir / "unk_literal.csv", "sequence\na b <unk>\nb b\n");
  CliRun lit = run_cli("predict --model " + cls() + " --data " + (dir / "unk_literal.csv").string());
  ASSERT_EQ(lit.code, 0) << lit.out;
  EXPECT_EQ(csv_of(lit.out)[1].fields, csv_of(r.out)[1].fields);
  EXPECT_THAT(lit.out, ::testing::Not(HasSubstr("read as <unk>")));
  write_text(dir / "noseq.csv", "id,text\n1,a b\n");
  CliRun bad = run_cli("predict --model " + cls() + " --data " + (dir / "noseq.csv").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.out, HasSubstr("no sequence column 'sequence'"));
}

TEST_F(PredictCli, CharlmTopKAfterEachLine) {
  write_text(dir / "ctx.txt", "the cat s\n\nthe doZ\n");
  CliRun r = run_cli("predict --model " + lm() + " --data " + (dir / "ctx.txt").string() + " --top-k 3");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rec = csv_of(r.out);
  ASSERT_EQ(rec.size(), 4u) << r.out;
  EXPECT_EQ(rec[0].fields, (std::vector<std::string>{"id", "next_1", "p_1", "next_2", "p_2", "next_3", "p_3"}));
  for (size_t i = 1; i < rec.size(); ++i) {
    const auto& f = rec[i].fields;
    ASSERT_EQ(f.size(), 7u);
    EXPECT_EQ(f[0], std::to_string(i));
    const double a = std::stod(f[2]), b = std::stod(f[4]), c = std::stod(f[6]);
    EXPECT_GE(a, b);
    EXPECT_GE(b, c);
    EXPECT_LE(a + b + c, 1.0 + 1e-6);
    EXPECT_GT(c, 0.0);
  }
  EXPECT_THAT(r.out, HasSubstr("1 input character(s) not in the model's vocabulary were read as <unk>"));  // 'Z'
  // JSON Lines: k entries per line; k larger than the vocabulary gives all of it, summing to 1.
  CliRun j = run_cli("predict --model " + lm() + " --data " + (dir / "ctx.txt").string() +
                     " --top-k 1000 --format jsonl");
  ASSERT_EQ(j.code, 0) << j.out;
  const std::string text = read_text(dir / "text.txt");
  const size_t vocab = std::set<char>(text.begin(), text.end()).size() + 1;  // and <unk>
  std::istringstream is(j.out);
  int n = 0;
  for (std::string line; std::getline(is, line);) {
    if (line.rfind("lstm predict:", 0) == 0) continue;
    const nlohmann::json o = nlohmann::json::parse(line);
    EXPECT_EQ(o["id"], ++n);
    double sum = 0;
    for (const auto& e : o["top"]) sum += e["p"].get<double>();
    EXPECT_NEAR(sum, 1.0, 1e-6);
    EXPECT_EQ(o["top"].size(), vocab);
  }
  EXPECT_EQ(n, 3);
}

TEST_F(PredictCli, EvalOnATestFileScoresEveryRowWithPerClassMetrics) {
  lstm::testing::write_majority_csv(dir / "test.csv", 37, 13);
  CliRun r = run_cli("eval --model " + cls() + " --data " + (dir / "test.csv").string() + " --batch-size 5 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = json_of(r.out);
  EXPECT_EQ(j["count"], 37);
  EXPECT_EQ(j["unknown_inputs"], 0);
  int64_t total = 0, diag = 0, support = 0;
  const auto& counts = j["confusion"]["counts"];
  for (size_t t = 0; t < counts.size(); ++t)
    for (size_t p = 0; p < counts[t].size(); ++p) {
      total += counts[t][p].get<int64_t>();
      if (t == p) diag += counts[t][p].get<int64_t>();
    }
  for (const auto& c : j["classes"]) support += c["support"].get<int64_t>();
  EXPECT_EQ(total, 37);
  EXPECT_EQ(support, 37);
  EXPECT_NEAR(j["accuracy"].get<double>(), static_cast<double>(diag) / 37, 1e-12);
  EXPECT_EQ(j["confusion"]["labels"], (std::vector<std::string>{"more_a", "more_b"}));
  // The text report has the table and the matrix.
  CliRun text = run_cli("eval --model " + cls() + " --data " + (dir / "test.csv").string());
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("over 37 targets"));
  EXPECT_THAT(text.out, HasSubstr("precision"));
  EXPECT_THAT(text.out, HasSubstr("confusion matrix"));
  // The training data itself is scored in full with the model's vocabulary (no "differ" refusal).
  CliRun all = run_cli("eval --model " + cls() + " --data " + (dir / "train.csv").string() + " --json");
  ASSERT_EQ(all.code, 0) << all.out;
  EXPECT_EQ(json_of(all.out)["count"], 200);
}

TEST_F(PredictCli, EvalUnknownTokenIsUnkAndUnknownClassIsAnErrorNamingIt) {
  write_text(dir / "unk.csv", "sequence,label\na a zz,more_a\nb b,more_b\n");
  CliRun r = run_cli("eval --model " + cls() + " --data " + (dir / "unk.csv").string() + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(json_of(r.out)["unknown_inputs"], 1);
  EXPECT_EQ(json_of(r.out)["count"], 2);
  write_text(dir / "badclass.csv", "sequence,label\na a,more_a\nb b,more_c\n");
  CliRun bad = run_cli("eval --model " + cls() + " --data " + (dir / "badclass.csv").string());
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.out, HasSubstr((dir / "badclass.csv").string() + ":3: unknown class 'more_c' in column 'label'"));
}

TEST_F(PredictCli, ModelsWithoutUnkRefuseUnknownInputByName) {
  // A model from before <unk> was reserved: the same weights with the vocabulary's last entry renamed.
  for (const char* run : {"cls", "lm"}) {
    SafetensorsFile f = read_safetensors((dir / run / "model.safetensors").string());
    for (const char* key : {"lstm_engine.tokens", "lstm_engine.vocab"}) {
      if (!f.metadata.count(key)) continue;
      nlohmann::json v = nlohmann::json::parse(f.metadata.at(key));
      ASSERT_EQ(v.back(), "<unk>");
      v.back() = "Q";
      f.metadata[key] = v.dump();
    }
    write_safetensors((dir / (std::string(run) + "_old.safetensors")).string(), f.tensors, f.metadata);
  }
  write_text(dir / "unk2.csv", "sequence,label\na a zz,more_a\n");
  CliRun e = run_cli("eval --model " + (dir / "cls_old.safetensors").string() + " --data " + (dir / "unk2.csv").string());
  EXPECT_EQ(e.code, 1);
  EXPECT_THAT(e.out, HasSubstr("unk2.csv:2: step 3 of column 'sequence' is the token 'zz'"));
  write_text(dir / "ctx2.txt", "the\nsat Z\n");
  CliRun p = run_cli("predict --model " + (dir / "lm_old.safetensors").string() + " --data " + (dir / "ctx2.txt").string());
  EXPECT_EQ(p.code, 1);
  EXPECT_THAT(p.out, HasSubstr("ctx2.txt:2: Vocab::encode: character U+005A 'Z'"));
}

TEST_F(PredictCli, CharlmEvalScoresEveryWindowOfTheWholeText) {
  const std::string text = read_text(dir / "text.txt");  // ASCII: bytes are characters
  const auto n = static_cast<int64_t>(text.size());
  CliRun r = run_cli("eval --model " + lm() + " --data " + (dir / "text.txt").string() + " --seq-len 8 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(json_of(r.out)["count"], (n - 1) / 8 * 8);
  EXPECT_EQ(json_of(r.out)["data"], "all of " + (dir / "text.txt").string());
}

TEST_F(PredictCli, TrainingsFinalValidationLossIsEvals) {
  // The periodic evaluation is a labelled estimate over fewer batches; the final one is all of them.
  EXPECT_THAT(classify_train_out, HasSubstr("(estimate: the first 1 held-out batches)"));
  EXPECT_THAT(classify_train_out, HasSubstr("over 60 targets (all held-out)"));
  for (const auto& [run, out] : {std::pair{cls(), classify_train_out}, std::pair{lm(), charlm_train_out}}) {
    const double trained = number_after(out, "final validation loss ");
    CliRun e = run_cli("eval --model " + run + " --json");
    ASSERT_EQ(e.code, 0) << e.out;
    const double evaluated = json_of(e.out)["loss"];
    ASSERT_TRUE(std::isfinite(trained)) << out;
    // The train line prints 6 significant digits.
    EXPECT_NEAR(trained, evaluated, 1e-5 * evaluated) << out << "\n" << e.out;
    // The same held-out split: the train log says how many rows/characters it held out.
    CliRun text = run_cli("eval --model " + run);
    EXPECT_THAT(text.out, HasSubstr("held-out"));
  }
}

TEST_F(PredictCli, InputRefusedAtOnceWritesNothingAndLeavesNoFile) {
  write_text(dir / "bad.csv", "id,sequence\n1,a b\n2,\"a b\n");  // an unterminated quote at line 3
  const fs::path out = dir / "bad_preds.csv";
  CliRun r = run_cli("predict --model " + cls() + " --data " + (dir / "bad.csv").string() + " --output " + out.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("bad.csv:3: unterminated quoted field 2"));
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_THAT(e.path().string(), ::testing::Not(HasSubstr(".tmp.")));
  // On standard output not even the header appears before the error.
  write_text(dir / "bad.txt", std::string("ok\n\xFF\n", 4));
  CliRun t = run_cli("predict --model " + lm() + " --data " + (dir / "bad.txt").string() + " --batch-size 8");
  EXPECT_EQ(t.code, 1);
  EXPECT_THAT(t.out, HasSubstr("bad.txt:2: Vocab::encode: invalid UTF-8"));
  EXPECT_THAT(t.out, ::testing::Not(HasSubstr("next_1")));
  // The input file is never the output.
  CliRun same = run_cli("predict --model " + cls() + " --data " + (dir / "bad.csv").string() + " --output " +
                        (dir / "bad.csv").string());
  EXPECT_THAT(same.out, HasSubstr("is the input file itself"));
}

// ---- regress, tag, forecast ----

namespace {

// Numeric rows: 2..7 steps of one number each; y = 100 + 10 * (their sum) (far from 0: predictions
// not put back into original units would be off by ~100).
void write_numeric_regress(const fs::path& p, int rows, uint64_t seed) {
  Rng rng(seed);
  std::string s = "id,sequence,y\n";
  for (int i = 0; i < rows; ++i) {
    const int n = 2 + static_cast<int>(rng.below(6));
    double sum = 0;
    std::string seq;
    for (int t = 0; t < n; ++t) {
      const double v = static_cast<double>(rng.below(100)) / 100.0;
      sum += v;
      if (t) seq += ' ';
      seq += std::to_string(v);
    }
    s += 'r';
    s += std::to_string(i);
    s += ',';
    s += seq;
    s += ',';
    s += std::to_string(100 + 10 * sum);
    s += '\n';
  }
  write_text(p, s);
}

// Token rows over {a, b, c}: regress targets n = the number of a's; tags the parity of the a's so far.
void write_token_rows(const fs::path& p, int rows, uint64_t seed, bool tags) {
  Rng rng(seed);
  std::string s = tags ? "id,sequence,tags\n" : "id,sequence,n\n";
  for (int i = 0; i < rows; ++i) {
    const int n = 2 + static_cast<int>(rng.below(7));
    int a = 0;
    std::string seq, tag;
    for (int t = 0; t < n; ++t) {
      const char c = "abc"[rng.below(3)];
      a += c == 'a';
      seq += std::string(t ? " " : "") + c;
      tag += std::string(t ? " " : "") + (a % 2 ? "odd" : "even");
    }
    s += std::to_string(i) + "," + seq + "," + (tags ? tag : std::to_string(a)) + "\n";
  }
  write_text(p, s);
}

double sine(int t) { return 50 + 3 * std::sin(2 * M_PI * t / 20.0); }

void write_sine(const fs::path& p, int steps) {
  std::string s = "t,s\n";
  for (int t = 0; t < steps; ++t) s += std::to_string(t) + "," + std::to_string(sine(t)) + "\n";
  write_text(p, s);
}

std::vector<nlohmann::json> jsonl_of(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream is(out);
  for (std::string line; std::getline(is, line);)
    if (line.rfind("lstm predict:", 0) != 0 && !line.empty()) v.push_back(nlohmann::json::parse(line));
  return v;
}

}  // namespace

class PredictTasksCli : public ::testing::Test {
 protected:
  static inline fs::path dir;
  static inline std::string train_out;

  static std::string train(const std::string& name, const nlohmann::json& cfg) {
    write_text(dir / (name + ".json"), cfg.dump());
    return run_cli("train --threads 1 --config " + (dir / (name + ".json")).string() + " --out " + (dir / name).string())
        .out;
  }
  static nlohmann::json train_cfg(int steps, int seq_len = 0) {
    nlohmann::json t = {{"steps", steps}, {"batch_size", 16}, {"eval_every", 0}, {"log_every", steps},
                        {"checkpoint_every", 0}, {"optimizer", {{"type", "adam"}}},
                        {"schedule", {{"type", "constant"}, {"lr", 0.01}}}};
    if (seq_len) t["seq_len"] = seq_len;
    return t;
  }

  static void SetUpTestSuite() {
    dir = lstm::testing::temp_dir("lstm_cli_predict", "tasks");
    write_numeric_regress(dir / "reg.csv", 120, 3);
    write_token_rows(dir / "regtok.csv", 120, 4, false);
    write_token_rows(dir / "tag.csv", 160, 5, true);
    write_sine(dir / "sine.csv", 400);
    const nlohmann::json head = {{{"type", "lstm"}, {"hidden_size", 12}, {"output", "h_n"}}, {{"type", "dense"}}};
    train_out += train("reg", {{"task", "regress"},
                               {"data", {{"path", (dir / "reg.csv").string()}, {"target_columns", {"y"}}, {"valid_fraction", 0.2}}},
                               {"model", {{"layers", head}}},
                               {"train", train_cfg(30)}});
    train_out += train("regtok", {{"task", "regress"},
                                  {"data", {{"path", (dir / "regtok.csv").string()}, {"target_columns", {"n"}}, {"valid_fraction", 0.2}}},
                                  {"model", {{"embedding_dim", 4}, {"layers", head}}},
                                  {"train", train_cfg(20)}});
    train_out += train("tag", {{"task", "tag"},
                               {"data", {{"path", (dir / "tag.csv").string()}, {"valid_fraction", 0.2}}},
                               {"model", {{"embedding_dim", 4}, {"layers", {{{"type", "lstm"}, {"hidden_size", 12}}, {{"type", "dense"}}}}}},
                               {"train", train_cfg(30)}});
    train_out += train("fc", {{"task", "forecast"},
                              {"data", {{"path", (dir / "sine.csv").string()}, {"target_columns", {"s"}}, {"horizon", 3}, {"valid_fraction", 0.1}}},
                              {"model", {{"layers", head}}},
                              {"train", train_cfg(300, 20)}});
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }
  void SetUp() override {
    size_t n = 0;
    for (size_t at = 0; (at = train_out.find("final validation loss", at)) != std::string::npos; ++at) ++n;
    ASSERT_EQ(n, 4u) << train_out;
  }
  static std::string run(const std::string& name) { return (dir / name).string(); }
  static std::string file(const std::string& name) { return (dir / name).string(); }
};

TEST_F(PredictTasksCli, RegressValuesInOriginalUnitsAgreeWithEvalAndStream) {
  write_numeric_regress(dir / "reg_test.csv", 23, 99);
  const auto input = parse_csv(read_text(dir / "reg_test.csv"), "reg_test.csv");
  CliRun r = run_cli("predict --model " + run("reg") + " --data " + file("reg_test.csv") + " --batch-size 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rec = csv_of(r.out);
  ASSERT_EQ(rec.size(), input.size()) << r.out;
  EXPECT_EQ(rec[0].fields, (std::vector<std::string>{"id", "y"}));
  double sq = 0;
  std::vector<double> pred;
  for (size_t i = 1; i < rec.size(); ++i) {
    ASSERT_EQ(rec[i].fields.size(), 2u);
    EXPECT_EQ(rec[i].fields[0], input[i].fields[0]);  // ids in input order
    pred.push_back(std::stod(rec[i].fields[1]));
    const double e = pred.back() - std::stod(input[i].fields[2]);
    sq += e * e;
    EXPECT_GT(pred.back(), 80.0) << "row " << i << ": not in the targets' original units (they are ~100..170)";
  }
  // The same numbers eval scores: its MSE (original units, inputs normalised as in training) is
  // the predictions' MSE against the file's targets.
  CliRun e = run_cli("eval --model " + run("reg") + " --data " + file("reg_test.csv") + " --json");
  ASSERT_EQ(e.code, 0) << e.out;
  const double mse = json_of(e.out)["mse"];
  EXPECT_NEAR(sq / static_cast<double>(pred.size()), mse, 1e-4 * mse) << e.out;
  // One chunk gives the same values; JSON Lines carries them per column.
  CliRun big = run_cli("predict --model " + run("reg") + " --data " + file("reg_test.csv") + " --format jsonl");
  ASSERT_EQ(big.code, 0) << big.out;
  const auto j = jsonl_of(big.out);
  ASSERT_EQ(j.size(), pred.size());
  for (size_t i = 0; i < j.size(); ++i) {
    EXPECT_EQ(j[i]["id"], input[i + 1].fields[0]);
    EXPECT_NEAR(j[i]["values"]["y"].get<double>(), pred[i], 1e-4) << "row " << i;
  }
  // The target column need not be there.
  write_text(dir / "reg_notarget.csv", "sequence\n0.5 0.25\n0.1\n");
  CliRun nt = run_cli("predict --model " + run("reg") + " --data " + file("reg_notarget.csv"));
  ASSERT_EQ(nt.code, 0) << nt.out;
  const auto nrec = csv_of(nt.out);
  ASSERT_EQ(nrec.size(), 3u);
  EXPECT_EQ(nrec[1].fields[0], "1");
  EXPECT_EQ(nrec[2].fields[0], "2");
}

TEST_F(PredictTasksCli, TagALabelPerStepAgreeingWithEval) {
  write_token_rows(dir / "tag_test.csv", 19, 77, true);
  const auto input = parse_csv(read_text(dir / "tag_test.csv"), "tag_test.csv");
  CliRun r = run_cli("predict --model " + run("tag") + " --data " + file("tag_test.csv") + " --batch-size 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rec = csv_of(r.out);
  ASSERT_EQ(rec.size(), input.size()) << r.out;
  EXPECT_EQ(rec[0].fields, (std::vector<std::string>{"id", "tags"}));
  int64_t steps = 0, right = 0;
  std::vector<std::vector<std::string>> tags;
  for (size_t i = 1; i < rec.size(); ++i) {
    ASSERT_EQ(rec[i].fields.size(), 2u);
    EXPECT_EQ(rec[i].fields[0], input[i].fields[0]);
    std::istringstream a(rec[i].fields[1]), want(input[i].fields[2]), seq(input[i].fields[1]);
    std::vector<std::string> got{std::istream_iterator<std::string>(a), {}};
    std::vector<std::string> truth{std::istream_iterator<std::string>(want), {}};
    std::vector<std::string> s{std::istream_iterator<std::string>(seq), {}};
    ASSERT_EQ(got.size(), s.size()) << "row " << i << ": one label per step";
    for (size_t t = 0; t < got.size(); ++t) {
      EXPECT_TRUE(got[t] == "even" || got[t] == "odd") << got[t];
      right += got[t] == truth[t];
    }
    steps += static_cast<int64_t>(got.size());
    tags.push_back(got);
  }
  CliRun e = run_cli("eval --model " + run("tag") + " --data " + file("tag_test.csv") + " --json");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(json_of(e.out)["count"], steps);
  EXPECT_NEAR(json_of(e.out)["accuracy"].get<double>(), static_cast<double>(right) / static_cast<double>(steps), 1e-9);
  // JSON Lines, one chunk: the same tags, and per step probabilities over the tags summing to 1
  // with the tag the most probable.
  CliRun j = run_cli("predict --model " + run("tag") + " --data " + file("tag_test.csv") + " --format jsonl --batch-size 64");
  ASSERT_EQ(j.code, 0) << j.out;
  const auto lines = jsonl_of(j.out);
  ASSERT_EQ(lines.size(), tags.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["tags"].get<std::vector<std::string>>(), tags[i]) << "row " << i;
    ASSERT_EQ(lines[i]["probabilities"].size(), tags[i].size());
    for (size_t t = 0; t < tags[i].size(); ++t) {
      const auto& p = lines[i]["probabilities"][t];
      const double even = p["even"], odd = p["odd"];
      EXPECT_NEAR(even + odd, 1.0, 1e-9);
      EXPECT_EQ(tags[i][t], even >= odd ? "even" : "odd");
    }
  }
}

TEST_F(PredictTasksCli, UnknownTokensAreUnkForRegressAndTagAndAnUnknownTagIsAnError) {
  for (const char* m : {"regtok", "tag"}) {
    write_text(dir / "unk.csv", "sequence\na zz b\nb\n");
    write_text(dir / "unk_lit.csv", "sequence\na <unk> b\nb\n");
    CliRun r = run_cli("predict --model " + run(m) + " --data " + file("unk.csv"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("1 input token(s) not in the model's vocabulary were read as <unk>")) << m;
    CliRun lit = run_cli("predict --model " + run(m) + " --data " + file("unk_lit.csv"));
    ASSERT_EQ(lit.code, 0) << lit.out;
    EXPECT_EQ(csv_of(lit.out)[1].fields, csv_of(r.out)[1].fields) << m;
  }
  // eval --data: tokens the model lacks are <unk> as for classify.
  write_text(dir / "regtok_unk.csv", "sequence,n\na zz a,2\nb c,0\n");
  CliRun er = run_cli("eval --model " + run("regtok") + " --data " + file("regtok_unk.csv") + " --json");
  ASSERT_EQ(er.code, 0) << er.out;
  EXPECT_EQ(json_of(er.out)["unknown_inputs"], 1);
  EXPECT_EQ(json_of(er.out)["count"], 2);
  write_text(dir / "tag_unk.csv", "sequence,tags\na zz,odd odd\nb,even\n");
  CliRun et = run_cli("eval --model " + run("tag") + " --data " + file("tag_unk.csv") + " --json");
  ASSERT_EQ(et.code, 0) << et.out;
  EXPECT_EQ(json_of(et.out)["unknown_inputs"], 1);
  EXPECT_EQ(json_of(et.out)["count"], 3);
  // A tag the model does not know is an error naming it and where it is.
  write_text(dir / "tag_bad.csv", "sequence,tags\na b,odd odd\nb a,even maybe\n");
  CliRun bad = run_cli("eval --model " + run("tag") + " --data " + file("tag_bad.csv"));
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.out, HasSubstr("tag_bad.csv:3: unknown tag 'maybe' at step 2 of column 'tags'"));
  // A model from before <unk> was reserved refuses the unknown token by name.
  SafetensorsFile f = read_safetensors((dir / "regtok" / "model.safetensors").string());
  nlohmann::json v = nlohmann::json::parse(f.metadata.at("lstm_engine.tokens"));
  ASSERT_EQ(v.back(), "<unk>");
  v.back() = "Q";
  f.metadata["lstm_engine.tokens"] = v.dump();
  write_safetensors((dir / "regtok_old.safetensors").string(), f.tensors, f.metadata);
  CliRun old = run_cli("predict --model " + file("regtok_old.safetensors") + " --data " + file("unk.csv"));
  EXPECT_EQ(old.code, 1);
  EXPECT_THAT(old.out, HasSubstr("unk.csv:2: step 2 of column 'sequence' is the token 'zz'"));
}

TEST_F(PredictTasksCli, ForecastTheStepsAfterTheEndOfTheSeries) {
  write_sine(dir / "sine_head.csv", 301);  // rows 0..300: the forecast is of steps 301..303
  CliRun r = run_cli("predict --model " + run("fc") + " --data " + file("sine_head.csv"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rec = csv_of(r.out);
  ASSERT_EQ(rec.size(), 4u) << r.out;
  EXPECT_EQ(rec[0].fields, (std::vector<std::string>{"step", "s"}));
  for (int h = 1; h <= 3; ++h) {
    EXPECT_EQ(rec[static_cast<size_t>(h)].fields[0], std::to_string(h));
    // Original units (the series is 50 +- 3), close to the truth the model learned.
    EXPECT_NEAR(std::stod(rec[static_cast<size_t>(h)].fields[1]), sine(300 + h), 0.6) << "step " << h << "\n" << r.out;
  }
  // Another end, another forecast: it follows the series' last rows.
  write_sine(dir / "sine_head2.csv", 306);
  CliRun r2 = run_cli("predict --model " + run("fc") + " --data " + file("sine_head2.csv") + " --format jsonl");
  ASSERT_EQ(r2.code, 0) << r2.out;
  const auto j = jsonl_of(r2.out);
  ASSERT_EQ(j.size(), 3u);
  for (int h = 1; h <= 3; ++h) {
    EXPECT_EQ(j[static_cast<size_t>(h - 1)]["step"], h);
    EXPECT_NEAR(j[static_cast<size_t>(h - 1)]["values"]["s"].get<double>(), sine(305 + h), 0.6) << "step " << h;
  }
  // Fewer rows than the context.
  write_sine(dir / "sine_short.csv", 19);
  CliRun s = run_cli("predict --model " + run("fc") + " --data " + file("sine_short.csv"));
  EXPECT_EQ(s.code, 1);
  EXPECT_THAT(s.out, HasSubstr("sine_short.csv: the series has 19 rows, but the model forecasts from the last "
                               "train.seq_len = 20 rows"));
}
