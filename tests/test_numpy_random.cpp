// NumPy-compatible random integers: reference values were produced once with
// NumPy 1.24 (Debian 12's python3-numpy) and frozen here, so the test needs no
// Python. They cover SeedSequence seeding, both Lemire paths (32-bit draws
// when the range fits in 32 bits, 64-bit otherwise), the special ranges
// (a single value, exactly 2^32 values, the full int64 range), negative lows,
// ranges where rejection is frequent, and the Engram multipliers of the tiny
// test model and of V4.1-Flash (compressed vocab 99092).
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/numpy_random.h"

using dsv4::engram_hash_multipliers;
using dsv4::numpy_default_rng_integers;
using dsv4::numpy_integers_int64;
using dsv4::numpy_seed_sequence_state;
using dsv4::NumpyPcg64;

namespace {

struct Case {
  uint64_t seed;
  int64_t low, high;
  bool endpoint;
  std::vector<int64_t> expected;  // size=(len,)
};

// np.random.default_rng(seed).integers(low, high, size=(n,), dtype=np.int64, endpoint=endpoint)
const std::vector<Case> kCases = {
    {0ULL, 0, 10, false,
     {8, 6, 5, 2, 3, 0, 0, 0}},
    {42ULL, 0, 385, false,
     {34, 297, 252, 168, 166, 330, 33, 268, 77}},
    {42ULL, -5, 5, false,
     {-5, 2, 1, -1, -1, 3, -5, 1, -3}},
    {7ULL, 0, 1, false,
     {0, 0, 0, 0, 0}},
    {7ULL, 100, 101, false,
     {100, 100, 100}},
    {123ULL, 0, 4294967296LL, false,
     {66316749, 2930678937LL, 2546691363LL, 231159515, 3904498326LL}},
    {123ULL, 0, 4294967295LL, false,
     {66316748, 2930678936LL, 2546691362LL, 231159514, 3904498325LL}},
    {99ULL, 0, 3221225472LL, false,
     {3086494194LL, 1630038897, 2440565981LL, 1820287557, 572789383, 1648996728, 3034138780LL, 3131631504LL, 3108584774LL, 1010463163, 1830569278, 2093595170, 923804696, 3097027853LL, 1133055250, 342700076, 1965134394, 1103985886, 2997165073LL, 966605252, 792052260, 1940830211, 1105382545, 1259755733, 870606188, 2921621431LL, 2151422344LL, 2495319762LL, 2456296592LL, 130676227, 962037012, 2263204497LL, 291792047, 2866432902LL, 208743587, 1401555304, 2008626696, 2677007105LL, 1885640049, 1891626737}},
    {99ULL, 0, 4294967297LL, false,
     {2173385198LL, 2427050078LL, 2198662305LL, 4175508674LL, 2640988885LL}},
    {5ULL, INT64_MIN, 4611686018427387904LL, false,
     {1954535694380135287LL, -5269293351055572136LL, -8477237638442414927LL, -3919441314598583829LL, -8596987100750288806LL, -197807504562116417LL, -5978909782196831855LL, -3205847400817063859LL, 4254550503541352463LL, 3196049786253827634LL, 2456613380533256290LL, -3794430724619608246LL, -2402369950110649986LL, 138664431119280926LL, -1536667503967230169LL, 2946653014630946865LL, -8334961568653335819LL, 173143902571348513LL, -6078407044212492082LL, 3165206340939859747LL, -8967185255365112329LL, -9206774344783031783LL, -2259302350482775151LL, -3182058019175693877LL, -4727771684514347059LL, 1930663872962900201LL, -4845239035898428178LL, -7161414581191009609LL, 1830002203277762686LL, -5964988177049510176LL, 1843007643347087477LL, -2208054896865775607LL, -2217506143863199590LL, -9022261754113560754LL, 3687834801340948680LL, 2466239313996486306LL, 3934086119896627004LL, -3697300354165723983LL, 3732358254137467570LL, -5901085828661629173LL}},
    {5ULL, INT64_MIN, INT64_MAX, false,
     {5626310876064179623LL, 5680504938125105652LL, 282706702330408383LL, -3951267122455837579LL, -8228526172304961300LL, -2151464407179853170LL}},
    {5ULL, INT64_MIN, INT64_MAX, true,
     {5626310876064179624LL, 5680504938125105653LL, 282706702330408384LL, -3951267122455837578LL, -8228526172304961299LL, -2151464407179853169LL}},
    {18446744073709551615ULL, -1000, 1000, false,
     {95, 360, 900, 690, -284, -986, -800}},
    {1099511627779ULL, 0, 4611686018427387904LL, false,
     {3567858950595158475LL, 4592581556621908176LL, 2182152584693574434LL, 299071029661050192LL, 902285084341709683LL, 2609041177942102391LL, 3069751233057683149LL}},
};

}  // namespace

TEST(NumpyRandom, SeedSequenceState) {
  // np.random.SeedSequence(seed).generate_state(4, np.uint64)
  EXPECT_EQ(numpy_seed_sequence_state(0ULL, 4), (std::vector<uint64_t>{15793235383387715774ULL, 12390638538380655177ULL, 2361836109651742017ULL, 3188717715514472916ULL}));
  EXPECT_EQ(numpy_seed_sequence_state(1ULL, 4), (std::vector<uint64_t>{7434755675892716031ULL, 10007452063617845036ULL, 5266248848659119178ULL, 15045448681910192573ULL}));
  EXPECT_EQ(numpy_seed_sequence_state(10007ULL, 4), (std::vector<uint64_t>{8634291315755388167ULL, 11042498673593962405ULL, 15418481100450270793ULL, 9041516862649747678ULL}));
  EXPECT_EQ(numpy_seed_sequence_state(4294967296ULL, 4), (std::vector<uint64_t>{5836529245451711556ULL, 8811601478698894690ULL, 4323349454413245209ULL, 13668837544996263139ULL}));
  EXPECT_EQ(numpy_seed_sequence_state(18446744073709551615ULL, 4), (std::vector<uint64_t>{12591116029944179981ULL, 1268942265879420026ULL, 1998214320288580263ULL, 12063755697402456310ULL}));
}

TEST(NumpyRandom, IntegersMatchNumpy) {
  for (const Case& c : kCases) {
    NumpyPcg64 gen(c.seed);
    EXPECT_EQ(numpy_integers_int64(gen, c.low, c.high, static_cast<int64_t>(c.expected.size()), c.endpoint), c.expected)
        << "seed " << c.seed << " range " << c.low << ".." << c.high;
    if (!c.endpoint) {
      EXPECT_EQ(numpy_default_rng_integers(c.seed, c.low, c.high, static_cast<int64_t>(c.expected.size())), c.expected);
    }
  }
}

// One generator, three calls: the high half of a 64-bit draw kept by a
// 32-bit call survives a 64-bit call and is the next 32-bit call's first draw.
TEST(NumpyRandom, HalfDrawCarriesAcrossCalls) {
  NumpyPcg64 gen(31337);
  EXPECT_EQ(numpy_integers_int64(gen, 0, 10, 3), (std::vector<int64_t>{6, 3, 0}));
  EXPECT_EQ(numpy_integers_int64(gen, 0, 1LL << 40, 2), (std::vector<int64_t>{70304652955LL, 771084935768LL}));
  EXPECT_EQ(numpy_integers_int64(gen, 0, 10, 3), (std::vector<int64_t>{8, 9, 3}));
}

TEST(NumpyRandom, RejectsEmptyRanges) {
  EXPECT_THROW(numpy_default_rng_integers(1, 5, 5, 1), std::invalid_argument);
  EXPECT_THROW(numpy_default_rng_integers(1, 6, 5, 1), std::invalid_argument);
  EXPECT_THROW(numpy_default_rng_integers(1, 0, 5, -1), std::invalid_argument);
  NumpyPcg64 gen(1);
  EXPECT_EQ(numpy_integers_int64(gen, 5, 5, 2, /*endpoint=*/true), (std::vector<int64_t>{5, 5}));
  EXPECT_TRUE(numpy_default_rng_integers(1, 0, 5, 0).empty());
}

// (np.random.default_rng(10007 * layer).integers(0, bound, size=(4,)) * 2 + 1)
// with bound = max(1, (2**63 - 1) // vocab // 2).
TEST(NumpyRandom, EngramHashMultipliers) {
  // The tiny V4.1-Flash test model (compressed vocab 385, layers 1 and 4).
  EXPECT_EQ(engram_hash_multipliers(1, 4, 385), (std::vector<int64_t>{19723708211466579LL, 1245696108671749LL, 9255365842776529LL, 19042995437472793LL}));
  EXPECT_EQ(engram_hash_multipliers(4, 4, 385), (std::vector<int64_t>{21172284637297873LL, 1296636070519091LL, 18957060011766439LL, 4878637091482255LL}));
  EXPECT_EQ(engram_hash_multipliers(14, 4, 385), (std::vector<int64_t>{17429075869545161LL, 13257945110432125LL, 7958592563667727LL, 21264686729637283LL}));
  // V4.1-Flash: compressed vocab 99092, Engram layers 1 and 14.
  EXPECT_EQ(engram_hash_multipliers(1, 4, 99092), (std::vector<int64_t>{76632096046245LL, 4839876093313LL, 35959672319349LL, 73987337458391LL}));
  EXPECT_EQ(engram_hash_multipliers(4, 4, 99092), (std::vector<int64_t>{82260218638837LL, 5037792023067LL, 73653454411355LL, 18954862957863LL}));
  EXPECT_EQ(engram_hash_multipliers(14, 4, 99092), (std::vector<int64_t>{67716810739261LL, 51510806800915LL, 30921347202721LL, 82619226485591LL}));
  // Every multiplier is odd and small enough that multiplier * id, id < vocab,
  // stays inside int64.
  for (int64_t vocab : {1, 2, 385, 99092, 129280}) {
    for (int64_t m : engram_hash_multipliers(3, 8, vocab)) {
      EXPECT_EQ(m % 2, 1);
      EXPECT_LE(m, INT64_MAX / vocab);
    }
  }
  EXPECT_EQ(engram_hash_multipliers(1, 0, 385).size(), 0u);
  EXPECT_THROW(engram_hash_multipliers(1, 4, 0), std::invalid_argument);
}
