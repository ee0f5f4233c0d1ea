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
