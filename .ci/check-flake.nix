# Evaluates flake.nix's `outputs` for real, without nixpkgs (no machine of this project reaches
# GitHub): `nixpkgs` is a stand-in whose builders (mkShell, writeShellScriptBin,
# buildPythonApplication, python311.withPackages) return what they were given, and whose Python
# package set holds exactly the names pyproject.toml declares, so a package name the project does
# not declare is an evaluation error. Checks, with a message naming what is wrong:
#   - nixpkgs is pinned to a full 40-hex revision, not a branch;
#   - every system's default devShell provides a `cptest` command that runs `python -m cptest` with
#     the shell's own Python, and its shellHook puts the checkout on PYTHONPATH;
#   - the package is named cptest, its main program is cptest, and its dependencies are exactly
#     pyproject.toml's [project.dependencies]; the dev shell's Python holds those and only
#     packages that pyproject.toml declares (its extras).
# Used by .ci/check-flake.sh and tests/test_flake.py (which runs the `cptest` wrapper it returns
# with a real Python, `python` being that Python's prefix).
{ flakeDir ? ../., python ? "/stand-in/python3-env" }:
let
  inherit (builtins) all any attrNames concatLists elem filter genList head length listToAttrs
    map match sort stringLength substring throw;

  flake = import (flakeDir + "/flake.nix");
  pyproject = builtins.fromTOML (builtins.readFile (flakeDir + "/pyproject.toml"));

  check = cond: msg: if cond then true else throw "check-flake: ${msg}";
  hasInfix = inf: s:
    let n = stringLength inf;
    in n <= stringLength s && any (i: substring i n s == inf) (genList (i: i) (stringLength s - n + 1));
  nameOf = req: head (match "([A-Za-z0-9_.-]+).*" req);
  genAttrs = names: f: listToAttrs (map (n: { name = n; value = f n; }) names);

  runtime = map nameOf pyproject.project.dependencies;
  declared = runtime
    ++ map nameOf (concatLists (builtins.attrValues pyproject.project."optional-dependencies"));

  stub = name: { inherit name; pname = name; outPath = "/stand-in/${name}"; };
  pythonPackages = genAttrs declared stub // {
    setuptools = stub "setuptools";
    buildPythonApplication = args: args // { outPath = "/stand-in/cptest-app"; };
  };
  pkgs = {
    python311 = {
      withPackages = f: { name = "python3-env"; outPath = python; pythonPackages = f pythonPackages; };
    };
    python311Packages = pythonPackages;
    mkShell = args: args // { outPath = "/stand-in/shell"; };
    writeShellScriptBin = name: text: { inherit name text; binName = name; outPath = "/stand-in/bin-${name}"; };
    ruff = stub "ruff";
    git = stub "git";
    podman = stub "podman";
    runc = stub "runc";
  };
  systemsKnown = [ "x86_64-linux" "aarch64-linux" "x86_64-darwin" "aarch64-darwin" ];
  nixpkgs = { lib = { inherit genAttrs; }; legacyPackages = genAttrs systemsKnown (_: pkgs); };

  outputs = flake.outputs { self = outputs // { outPath = toString flakeDir; }; inherit nixpkgs; };
  url = flake.inputs.nixpkgs.url;
  systems = attrNames outputs.devShells;

  shellOf = system:
    let
      shell = outputs.devShells.${system}.default;
      commands = filter (p: (p.binName or null) == "cptest") shell.packages;
      pythons = filter (p: (p.name or null) == "python3-env") shell.packages;
      wrapper = head commands;
      py = head pythons;
    in
    assert check (commands != [ ]) "${system}: the default devShell has no `cptest` command in packages";
    assert check (length pythons == 1) "${system}: the default devShell has no (or several) python311.withPackages";
    assert check (hasInfix "exec ${py.outPath}/bin/python -m cptest \"$@\"" wrapper.text)
      "${system}: the cptest command does not exec the shell's python -m cptest \"$@\": ${wrapper.text}";
    assert check (hasInfix "export PYTHONPATH=\"$PWD" (shell.shellHook or ""))
      "${system}: the shellHook does not put the checkout ($PWD) on PYTHONPATH";
    assert check (all (n: elem n (map (p: p.pname or null) py.pythonPackages)) runtime)
      "${system}: the dev shell's Python lacks one of pyproject.toml's dependencies";
    assert check (all (p: elem (p.pname or null) declared) py.pythonPackages)
      "${system}: the dev shell's Python holds a package that pyproject.toml does not declare";
    wrapper.text;

  packageOf = system:
    let
      p = outputs.packages.${system}.default;
      deps = sort builtins.lessThan (map (d: d.pname) p.dependencies);
    in
    assert check (p.pname == "cptest") "${system}: packages.default.pname is ${p.pname}, not cptest";
    assert check ((p.meta.mainProgram or null) == "cptest") "${system}: packages.default has no meta.mainProgram = \"cptest\"";
    assert check (deps == sort builtins.lessThan runtime)
      "${system}: packages.default's dependencies ${toString deps} are not pyproject.toml's ${toString runtime}";
    p.pname;
in
assert check (match "github:NixOS/nixpkgs/[0-9a-f]{40}" url != null)
  "inputs.nixpkgs.url is ${url}: pin a full 40-hex nixos-25.05 revision, not a branch";
assert check (systems != [ ]) "no devShells";
assert check (pyproject.project.scripts.cptest or null == "cptest.cli:main")
  "pyproject.toml has no `cptest = \"cptest.cli:main\"` console script (python -m cptest runs that)";
{
  inherit url systems;
  wrappers = genAttrs systems shellOf;
  packages = genAttrs (attrNames outputs.packages) packageOf;
}
