# The number of escha cases test-backend-ops registers per op
# (test-backend-ops-escha.inc), for the scripts that check that all of
# them ran and passed (scripts/test-all.sh, hip/device-bench.sh). A new
# case changes the count here only.
escha_cases_of() {
    case $1 in
        ESCHA_LINEAR) echo 172 ;;
        ESCHA_MOE) echo 51 ;;
        *) echo "escha_cases_of: no such op: $1" >&2; return 1 ;;
    esac
}
