// The one source of ula_cli_pch (tools/ula/CMakeLists.txt), an executable that exists to
// build the precompiled header every subcommand of `ula` reuses.
int main() { return 0; }
