{
  description = "cptest: reproducible qualification of SGLang prefill and decode context parallelism";

  # nixpkgs pinned to one commit of the nixos-25.05 branch, so that `nix flake lock` records the
  # same tree for everyone (docs/decisions.md D2, D41). The revision is the one that public
  # flake.lock files locking `github:NixOS/nixpkgs/nixos-25.05` record (lastModified 1767313136,
  # 2026-01-02; narHash sha256-16KkgfdYqjaeRGBaYsNrhPRRENs0qzkQVUooNHtoy2w=); this project's
  # machines cannot reach GitHub, so flake.lock is made by the first developer who can.
  # .ci/check-flake.sh checks that this stays a full 40-hex revision.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/ac62194c3917d5f474c1a844b6fd6da2db95077d";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      # pyproject.toml [project.dependencies]; .ci/check-flake.sh checks that both lists below
      # name exactly these (nixpkgs' runtime-deps check fails a build that misses one).
      runtimeDeps = ps: with ps; [
        lark
        pydantic
        jinja2
        docker
        httpx
        psutil
        click
        numpy
        nvidia-ml-py
        aiohttp
        orjson
        regex
        matplotlib     # report.html's plots
        rich           # live progress on a terminal (cptest/console.py)
        pyyaml         # compile --target lws writes YAML (cptest/k8s/yaml_text.py)
      ];
      # nixpkgs' torch is its CPU build unless cudaSupport is set: what the reference engine needs.
      pythonFor = pkgs: pkgs.python311.withPackages (ps: runtimeDeps ps ++ (with ps; [
        # reference engine, synthetic weights ([reference] / [weights] extras)
        torch
        safetensors
        setproctitle
        # tests ([test] extra)
        pytest
        hypothesis
        transformers   # parity tests of the reference engine
      ]));
      # The `cptest` command of the dev shell: the checkout itself, in development mode (the
      # shellHook puts it on PYTHONPATH; edits take effect without a rebuild), run by the shell's
      # Python. The SGLang plugin entry point needs an installed distribution: not in this shell.
      cptestIn = pkgs: pkgs.writeShellScriptBin "cptest" ''
        exec ${pythonFor pkgs}/bin/python -m cptest "$@"
      '';
    in
    {
      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pythonFor pkgs)
            (cptestIn pkgs)
            pkgs.ruff
            pkgs.git
            pkgs.podman   # a Docker-API engine for the docker launcher's tests
            pkgs.runc
          ];
          # Run `nix develop` in the checkout: $PWD is the source tree the `cptest` command runs.
          shellHook = ''
            export PYTHONPATH="$PWD''${PYTHONPATH:+:$PYTHONPATH}"
            echo "cptest dev shell: cptest --help; python -m pytest"
          '';
        };
      });

      packages = forAll (pkgs: {
        default = (pkgs.python311Packages.buildPythonApplication {
          pname = "cptest";
          version = "0.1.0";
          pyproject = true;
          src = ./.;
          build-system = [ pkgs.python311Packages.setuptools ];
          dependencies = runtimeDeps pkgs.python311Packages;
          doCheck = false;
          meta.mainProgram = "cptest";
        });
      });
    };
}
